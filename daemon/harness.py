"""The test harness's former home: it is ``cellcal.testing.harness`` now.

Kept so code written against ``cellcal.daemon.harness`` (the ZeroMQ contract tests import
it by this name) goes on working; new code imports ``cellcal.testing``.
"""

from cellcal.testing.harness import *  # noqa: F403 - a re-export of the whole module
from cellcal.testing.harness import __all__  # noqa: F401
