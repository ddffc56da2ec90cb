"""``python -m cellcal.daemon.cli``: the ``cellcal`` command (for a checkout without the script)."""

import sys

from cellcal.daemon.cli import main

if __name__ == "__main__":  # imported (by pkgutil.walk_packages, say): nothing runs
    sys.exit(main())
