"""``cellcal keys [--out DIR] [--force] NAME``: generate a CURVE key pair.

Writes ``NAME.key`` (public certificate, mode 0644: give it to the other side) and
``NAME.key_secret`` (public + secret, mode 0600: keep it), in the ZeroMQ certificate format
``zmq.auth.load_certificate`` and czmq read, and prints the Z85 public key on stdout (the
value for ``[[zmq.clients]] public_key``). Files are written temp + fsync + rename, the
secret one created 0600 from the start, so no moment exists where it is readable by others.

Exit codes: 0 written, 2 bad usage or the files exist (``--force`` overwrites).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import sys
from pathlib import Path

import zmq

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_BANNER = """#   ****  Generated on {date} by cellcal keys  ****
#   ZeroMQ CURVE {what} Certificate
#   {advice}

"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="file stem: NAME.key (public) and NAME.key_secret (secret)")
    p.add_argument("--out", default=".", help="directory to write into (created 0700 if missing); default .")
    p.add_argument("--force", action="store_true", help="overwrite existing files")


def _certificate(what: str, public: bytes, secret: bytes | None) -> str:
    advice = ("DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions." if secret
              else "Give this file (or the key below) to the other side; it is not secret.")
    text = _BANNER.format(date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), what=what, advice=advice)
    text += "metadata\ncurve\n"
    text += f'    public-key = "{public.decode("ascii")}"\n'
    if secret:
        text += f'    secret-key = "{secret.decode("ascii")}"\n'
    return text


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; say exactly what we mean
        with os.fdopen(fd, "w", encoding="ascii") as f:
            fd = -1
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> int:
    if not _NAME.match(args.name):
        print(f"cellcal keys: NAME must be 1-64 characters of letters, digits, _ . - (got {args.name!r})", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        print(f"cellcal keys: cannot create {out}: {exc}", file=sys.stderr)
        return 2
    public_path, secret_path = out / f"{args.name}.key", out / f"{args.name}.key_secret"
    existing = [str(p) for p in (public_path, secret_path) if p.exists()]
    if existing and not args.force:
        print(f"cellcal keys: {', '.join(existing)} exist(s); --force to overwrite", file=sys.stderr)
        return 2
    public, secret = zmq.curve_keypair()
    try:
        _write(secret_path, _certificate("**Secret**", public, secret), 0o600)
        _write(public_path, _certificate("Public", public, None), 0o644)
        dfd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the renames, too, must survive a power cut
        finally:
            os.close(dfd)
    except OSError as exc:
        print(f"cellcal keys: cannot write: {exc}", file=sys.stderr)
        return 2
    print(public.decode("ascii"))
    print(f"wrote {public_path} (public) and {secret_path} (secret, mode 0600)", file=sys.stderr)
    return 0
