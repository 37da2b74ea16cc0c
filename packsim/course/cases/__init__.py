"""What a lesson's checks run on, apart from the checks (``packsim.course.exercises``).

- ``lesson04_backend_cases``: the packs, tiny models and trap diagnosis behind lesson 04's
  ``forward_kwargs_for`` check;
- ``lesson07_cases``: the batches, models and audit reports of lesson 07's checks;
- ``lesson09_logp_cases``: the packed rows and their ground truth behind appendix A8's log-prob check;
- ``lesson09_rubric``: a written answer read against a rubric, sentence by sentence, no verdict
  (interview question 1's self-check).

Lessons: none directly (the checks of 04, 07, 09 and A8 run on them).
"""
