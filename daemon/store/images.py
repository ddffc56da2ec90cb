"""Camera stations' images beside the store: where each goes and how it is written (ADR 0030).

A camera station's image is ``<state_dir>/images/run_<id>/station_<index>.png``
(:func:`station_image_path`, the path its row holds). ``Store.add_station`` writes it in two
steps around the row's duplicate test: :func:`write_temporary` (the bytes under a hidden
temporary name beside the image, fsynced; the folders made and their names fsynced into their
parents) before the transaction, :func:`put_in_place` (renamed to its name, the folder
fsynced) inside it, before the row is inserted and committed. So a row never exists without
its whole image; an image may exist without its row (the process died between the rename
and the commit), and is replaced when the station is captured again.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
from pathlib import Path

from cellcal.daemon.store.records import StationRecord

__all__ = ["IMAGES_DIR", "station_image_path", "with_image_path", "write_temporary", "put_in_place", "fsync_directory"]

#: The folder of the state directory that holds camera stations' images.
IMAGES_DIR = "images"
#: Suffix of an image being written: never a station's image (its name starts with a dot too).
_TMP_SUFFIX = ".tmp"


def station_image_path(run_id: int, plan_index: int) -> str:
    """Where a camera station's image goes, relative to the state directory (``/``-separated,
    what the row's ``camera["image"]`` holds)."""
    return f"{IMAGES_DIR}/run_{int(run_id)}/station_{int(plan_index)}.png"


def with_image_path(st: StationRecord, run_id: int, state_dir: Path) -> tuple[StationRecord, Path | None, bytes | None]:
    """``(station as its row holds it, where its image goes, the image)`` of a station about to
    be committed: a camera station's ``camera`` gets the image's path (relative to the state
    directory), sha256 and size, and loses the image itself (``image_png``); any other station
    is returned as it is, with no path and no image. The store decides the path and the hash."""
    image = st.image_png
    if image is None:
        return st, None, None
    rel = station_image_path(run_id, st.plan_index)
    camera = dict(st.camera or {})
    camera.update(image=rel, image_sha256=hashlib.sha256(image).hexdigest(), image_bytes=len(image))
    return dataclasses.replace(st, camera=camera, image_png=None), Path(state_dir) / rel, image


def fsync_directory(path: Path) -> None:
    """Make a folder's entries (a rename, a new file's name) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot fsync a directory: as durable as they allow
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_temporary(final: Path, data: bytes) -> Path:
    """``data`` written and fsynced under a temporary name beside ``final`` (module
    docstring); returns that name. Raises ``OSError``."""
    made = []
    d = final.parent
    while not d.exists():
        made.append(d)
        d = d.parent
    final.parent.mkdir(parents=True, exist_ok=True)
    for new_dir in reversed(made):  # each new folder's name is on disk in its parent
        fsync_directory(new_dir.parent)
    # One name per station: a temporary a kill left is overwritten when the station is captured
    # again (one daemon writes a state directory: its lock), so at most one lingers per station.
    tmp = final.with_name(f".{final.name}{_TMP_SUFFIX}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def put_in_place(tmp: Path, final: Path) -> None:
    """The temporary file renamed to ``final`` (atomic), and the rename made durable. Raises
    ``OSError``."""
    os.replace(tmp, final)
    fsync_directory(final.parent)
