"""Reference solutions to the course exercises, one module per lesson (see packsim.course.exercises).

Open these on purpose, after trying: each lesson's checks say what is wrong and give a hint
first. ``packsim.course.exercises.show_solution(lesson, name)`` prints one solution.

Lessons: none directly.
"""
