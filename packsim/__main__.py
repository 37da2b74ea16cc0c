"""``python -m packsim ...``: the same command line as the ``packsim`` script."""

from packsim.cli import main

raise SystemExit(main())
