(function (img) {
  /* What ipywidgets does not tell a screen reader, set from the widget's own classes: aria-pressed
     on quiz words (packsim-marked) and toggle buttons (mod-active), aria-label on each slider
     handle (its description). Runs once per packsim widget root, then on every class change. */
  var html = img.closest('.widget-html');
  var root = html && html.parentElement;
  if (!root || root.packsimAria) { return; }
  root.packsimAria = true;
  function sync() {
    root.querySelectorAll('.packsim-quiz-word, .widget-toggle-button').forEach(function (b) {
      var on = String(b.classList.contains('packsim-marked') || b.classList.contains('mod-active'));
      if (b.getAttribute('aria-pressed') !== on) { b.setAttribute('aria-pressed', on); }
    });
    root.querySelectorAll('.widget-slider').forEach(function (s) {
      var label = s.querySelector('.widget-label'), handle = s.querySelector('[role="slider"]');
      var name = label ? label.textContent.trim() : '';
      if (handle && name && handle.getAttribute('aria-label') !== name) {
        handle.setAttribute('aria-label', name);
      }
    });
  }
  sync();
  new MutationObserver(sync).observe(root, {subtree: true, childList: true, attributes: true,
                                            attributeFilter: ['class']});
})(this);
