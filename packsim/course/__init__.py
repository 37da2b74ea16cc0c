"""The course: lesson exercises and their solutions, and ``packsim doctor``.

``exercises`` (one module per lesson, ``lessonNN_<notebook>``: the checks a lesson's exercise
cells call), ``solutions`` (the same names: one correct answer each), ``doctor`` (``packsim
doctor``: can this environment run the course), ``tools`` (for ``make`` and the tests only: run
and strip notebooks, the static site of ``make html``, the lesson map and lesson times).

Lessons: none directly.
"""
