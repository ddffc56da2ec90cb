"""The one way a command writes a file a person named (``-o FILE``): never through a symlink,
never over an existing file unless ``--force``, never half-written.

``cellcal report -o`` uses it (and ``cellcal init -o`` / ``cellcal stations -o`` refuse the
same files with the same words). The rules, and why:

* An existing ``FILE`` is kept unless ``--force``: a typo must not replace a configuration or
  a station file someone made.
* A symlink at ``FILE`` (dangling or not) is refused unless ``--force``: writing through it
  would change a file elsewhere, perhaps one the user did not mean (``-o`` pointed by someone
  else at ``/etc/...``). With ``--force`` the link itself is replaced by the new file; the file
  it pointed to is never written.
* The bytes go to a temporary file beside ``FILE`` (created exclusively, so a planted name is
  never followed), are fsynced, and are then linked (no ``--force``: ``link`` fails if
  ``FILE`` appeared meanwhile, so the check and the write cannot race) or renamed (``--force``)
  onto ``FILE``; the directory is fsynced so the name survives a power cut. A reader sees the
  old file or the new one, never a torn one.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from cellcal.solver.errors import CellcalError

__all__ = ["OutputRefused", "check_output", "write_output"]

_TMP_SUFFIX = ".cellcal-tmp"


class OutputRefused(CellcalError):
    """The output file cannot or may not be written; the message names it and why (exit 2)."""


def check_output(path: str | os.PathLike[str], *, force: bool) -> Path:
    """Refuse ``path`` as an output file now, before any work is done for it.

    Raises
    ------
    OutputRefused
        ``path`` is a directory, or a symlink or an existing file without ``force``.
    """
    out = Path(path)
    if out.is_symlink():
        if not force:
            raise OutputRefused(f"{out} is a symbolic link (to {os.readlink(out)}); not written through "
                                "(--force replaces the link itself with the file)")
        return out
    if out.is_dir():
        raise OutputRefused(f"{out} is a directory; give a file name")
    if out.exists() and not force:
        raise OutputRefused(f"{out} exists; not replaced (--force replaces it)")
    return out


def write_output(path: str | os.PathLike[str], data: str | bytes, *, force: bool, mode: int = 0o644,
                 make_parents: bool = False) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` by the module's rules; returns the path.

    Parameters
    ----------
    force : bool
        Replace an existing file or a symlink at ``path`` (the link, never its target).
    mode : int
        Permission bits of the new file (before the umask is undone: exactly these).
    make_parents : bool
        Create missing parent directories.

    Raises
    ------
    OutputRefused
        ``path`` is a directory, a symlink or an existing file (without ``force``), or it
        cannot be written (the message carries the system's reason). Nothing is left behind:
        no temporary file, and the previous file, if any, unchanged.
    """
    out = check_output(path, force=force)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    directory = out.parent if str(out.parent) else Path(".")
    tmp: str | None = None
    try:
        if make_parents:
            directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{out.name}.", suffix=_TMP_SUFFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, out)  # a symlink at ``out`` is replaced, not followed
        else:
            try:
                os.link(tmp, out)  # fails if ``out`` exists now, whatever it is: no race with the check
            except FileExistsError:
                raise OutputRefused(f"{out} exists; not replaced (--force replaces it)") from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                    raise
                _create_exclusive(out, payload, mode)  # a file system without hard links
            os.unlink(tmp)
        tmp = None
        _fsync_directory(directory)
    except OutputRefused:
        raise
    except OSError as exc:
        raise OutputRefused(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return out


def _create_exclusive(out: Path, payload: bytes, mode: int) -> None:
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise OutputRefused(f"{out} exists; not replaced (--force replaces it)") from None
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def _fsync_directory(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # the file is written; only the durability of its name is not assured
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
