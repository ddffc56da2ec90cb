"""``<state_dir>/cellcal.lock``: one daemon per state directory."""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["StateDirLock", "StateDirLocked"]


class StateDirLocked(CellcalError):
    """Another daemon holds the state directory's lock file (the message names its pid)."""


class StateDirLock:
    """``<state_dir>/cellcal.lock``: one daemon per state directory.

    An exclusive ``flock`` on the file, held while the daemon runs; the holder's pid is
    written into it so a refused second daemon can name it. The kernel drops the lock when
    its process dies (kill -9 included), so a stale file never blocks a restart.
    """

    NAME = "cellcal.lock"

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (idempotent).

        Raises
        ------
        StateDirLocked
            Another process (or another daemon in this one) holds it.
        """
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            # A state directory nobody can write (read-only, full, not ours): no daemon can
            # run on it, and the store's own error says why in its words.
            log.debug("no lock file in %s: %s", self.path.parent, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise StateDirLocked(f"state directory {self.path.parent} is in use by another cellcal daemon "
                                 f"(pid {holder}, lock file {self.path}); stop it, or give this one another "
                                 "[service] state_dir") from None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as exc:  # a full disk: the lock holds all the same; the store says what is wrong
            log.debug("cannot write the pid into %s: %s", self.path, exc)

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays (removing it would race a new holder)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock
