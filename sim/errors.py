"""Simulator errors: the ``SimError`` branch of the one exception tree.

The whole tree is documented in :mod:`cellcal.solver.errors`. ``ScenarioError`` (also a
``ValueError``) is an invalid scenario file, its message starting with the dotted path of
the key; ``SimRefused`` is the simulated controller refusing a command (protective stop,
unreachable pose), which the simulated servers turn into what a real controller sends.
"""

from __future__ import annotations

from cellcal.solver.errors import CellcalError

__all__ = ["SimError", "ScenarioError", "SimRefused"]


class SimError(CellcalError):
    """Something the simulator raises on purpose."""


class ScenarioError(SimError, ValueError):
    """A scenario file is invalid; the message starts with the dotted path of the key."""


class SimRefused(SimError):
    """The simulated controller refused a command (protective stop, unreachable pose)."""
