"""The example configurations and the demo scenario, wherever cellcal is installed.

They live in the repository's ``config/``, which pyproject.toml installs as the data-only
package ``cellcal.examples`` (``package-dir``, ``*.toml`` as package data): one copy, read in
place by an editable install and carried by the wheel, so ``cellcal demo`` and ``cellcal
init`` find them from any working directory.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["EXAMPLES", "example_path"]

#: The package ``config/`` installs as (named by string: it holds data, no code to type-check).
PACKAGE = "cellcal.examples"

#: What each file is, by name.
EXAMPLES = {
    "cellcal.toml": "a UR arm over RTDE and a laser tracker on a serial port (production)",
    "cellcal-can.toml": "CiA 402 drives over CANopen and a laser tracker (production)",
    "demo.toml": "the daemon of `cellcal demo` (the simulated cell on loopback)",
    "demo-scenario.toml": "the simulated cell of `cellcal demo` and `cellcal sim`",
}


def example_path(name: str) -> Path:
    """The installed path of the example file ``name`` (one of :data:`EXAMPLES`).

    Raises
    ------
    ValueError
        ``name`` is not one of the examples.
    FileNotFoundError
        The installation lacks it (a broken install).
    """
    if name not in EXAMPLES:
        raise ValueError(f"no example file {name!r}; the examples are: {', '.join(EXAMPLES)}")
    path = Path(str(files(PACKAGE) / name))
    if not path.is_file():
        raise FileNotFoundError(f"example file {name} is not installed (looked at {path})")
    return path
