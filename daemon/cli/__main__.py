"""``python -m cellcal.daemon.cli``: the ``cellcal`` command (for a checkout without the script)."""

import sys

from cellcal.daemon.cli import main

sys.exit(main())
