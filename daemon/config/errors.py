"""The configuration's one error: :class:`ConfigError`, naming the dotted key (a leaf module:
the sections' own checks and the transport's security rules raise it without importing the
configuration).
"""

from __future__ import annotations

from cellcal.solver.errors import CellcalError


class ConfigError(CellcalError, ValueError):
    """A configuration file that cannot be used; ``.path`` is the dotted key path.

    Attributes
    ----------
    path : str
        The dotted key (``capture.sync_window_s``, ``tracker.options.timeout_s``,
        ``zmq.clients[0].public_key``); empty for the file as a whole (not TOML, too big).
    message : str
        What is wrong, without the file and the path.
    file : str or None
    """

    def __init__(self, path: str, message: str, *, file: str | None = None) -> None:
        self.path = path
        self.message = message
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")

    def with_file(self, file: str | None) -> ConfigError:
        """The same error (same class) naming ``file``."""
        exc = type(self).__new__(type(self))
        ConfigError.__init__(exc, self.path, self.message, file=file)
        return exc
