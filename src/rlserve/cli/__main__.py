"""``python -m rlserve.cli``: the ``rlserve`` command without its console script."""

import sys

from rlserve.cli import main

sys.exit(main())
