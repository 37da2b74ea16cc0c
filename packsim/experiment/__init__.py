"""The experiment: train setups side by side on the same data and score them on examples run alone.

``training`` (one run), ``evaluation`` (isolated and in-pack scores), ``comparison`` (the runs of
``packsim compare``; ``compare_command`` is its command line), ``throughput`` (packed vs padded
tokens/s on the long-tailed mix), ``results`` (``results.json``), ``report`` (``report.html``),
``facts`` (the design where the loss curve lies). Lessons 06 and 09 read its runs.

Lessons: none directly.
"""
