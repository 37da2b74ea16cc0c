"""Course tooling: exercises and their solutions, quizzes, notebook runner, static site, doctor.

``exercises`` (one module per lesson, ``lessonNN_<name>``), ``solutions`` (the same names),
``quizzes/*.yaml`` (the click-words quizzes of lesson 09), ``notebook_tools`` (run and strip
notebooks), ``static_site`` (``make html``), ``check_env`` (``packsim doctor``), ``paths`` (where
the committed runs are).

Lessons: none directly.
"""
