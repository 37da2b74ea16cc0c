"""Course tooling run by make and the tests (lesson map, static site, notebook checks); no lesson imports it.

Lessons: none directly.
"""
