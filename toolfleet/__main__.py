"""``python -m toolfleet``: the ``toolfleet`` command without the installed script."""

import sys

from toolfleet.cli import main

sys.exit(main())
