"""The store's errors: one tree under ``StoreError`` (``CellcalError``), each naming what failed."""

from __future__ import annotations

from pathlib import Path

from cellcal.solver.errors import CellcalError

__all__ = ["StoreError", "StoreFullError", "StoreReadOnlyError", "StoreCorruptError", "DuplicateStation", "UnknownRecord",
           "RunClosed"]


# --------------------------------------------------------------------------------------
# Errors


class StoreError(CellcalError):
    """The store could not do what was asked.

    Attributes
    ----------
    state_dir : pathlib.Path or None
        The state directory the store lives in (also named in the message).
    """

    def __init__(self, message: str, *, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        super().__init__(message)


class StoreFullError(StoreError):
    """The disk (or the database's size limit) is full; the write was rolled back."""


class StoreReadOnlyError(StoreError):
    """The state directory or the database cannot be written; nothing was changed."""


class StoreCorruptError(StoreError):
    """The file is not a cellcal database or SQLite found it damaged."""


class DuplicateStation(StoreError):
    """The run already holds a station for this plan index (committed before a crash).

    Attributes
    ----------
    run_id, plan_index : int
    """

    def __init__(self, message: str, *, run_id: int, plan_index: int, state_dir: Path | None = None) -> None:
        self.run_id = run_id
        self.plan_index = plan_index
        super().__init__(message, state_dir=state_dir)


class UnknownRecord(StoreError, LookupError):
    """No run, result or station with the id given.

    Attributes
    ----------
    table : str
        ``"run"`` or ``"result"``.
    record_id : int
    """

    def __init__(self, table: str, record_id: int, *, state_dir: Path | None = None) -> None:
        self.table = table
        self.record_id = record_id
        super().__init__(f"no {table} with id {record_id} in the store in {state_dir}", state_dir=state_dir)


class RunClosed(StoreError):
    """The run has finished (done, failed or aborted) and takes no more stations or status changes."""
