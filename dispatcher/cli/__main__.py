"""``python -m dispatcher.cli``: the ``toolfleet`` command without the installed script."""

import sys

from dispatcher.cli import main

sys.exit(main())
