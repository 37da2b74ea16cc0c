"""The course: lesson exercises, their solutions and the cases they run on.

``exercises`` (one module per lesson, ``lessonNN_<notebook>``: the checks a lesson's exercise
cells call), ``solutions`` (the same names: one correct answer each), ``cases`` (what some checks
run on: lesson 04's backend cases, lesson 07's batches and reports, lesson 09's rubric), ``tools``
(for ``make`` and the tests only, not in the wheel: run and strip notebooks, the static site of
``make html``, the lesson map and lesson times). ``packsim doctor`` lives in ``packsim.commands``.

Lessons: none directly.
"""
