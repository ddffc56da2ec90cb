"""A scripted device on a real pty or loopback socket (PyMeasure's expected_protocol on real I/O).

It expects exact request bytes and answers exact reply bytes, in order; the script must be
consumed exactly, with nothing left over. Shared by the driver tests of every tracker protocol.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
import tty

STEP_TIMEOUT_S = 3.0


class ScriptedDevice:
    """Expects ``steps[i][0]`` bytes, then sends ``steps[i][1]`` (bytes or None: silence)."""

    def __init__(self, steps, transport="pty"):
        self.steps = list(steps)
        self.transport = transport
        self.errors: list[str] = []
        self.consumed = 0
        self.extra = b""
        self._stop = threading.Event()

    def __enter__(self):
        if self.transport == "pty":
            self.master, self.slave = os.openpty()
            tty.setraw(self.slave)
            self.url = os.ttyname(self.slave)
            self._fd = self.master
            self._listen = None
        else:
            self._listen = socket.create_server(("127.0.0.1", 0))
            self.url = f"socket://127.0.0.1:{self._listen.getsockname()[1]}"
            self.master = self.slave = -1
            self._fd = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _recv(self, n_max):
        if self._fd is None:
            return self._conn.recv(n_max)
        return os.read(self._fd, n_max)

    def _send(self, data):
        if self._fd is None:
            self._conn.sendall(data)
        else:
            os.write(self._fd, data)

    def _run(self):
        try:
            if self._listen is not None:
                r, _, _ = select.select([self._listen], [], [], STEP_TIMEOUT_S)
                if not r:
                    self.errors.append("no connection")
                    return
                self._conn, _ = self._listen.accept()
                self._fd_sel = self._conn
            else:
                self._fd_sel = self.master
            buf = b""
            for expect, reply in self.steps:
                deadline = time.monotonic() + STEP_TIMEOUT_S
                while len(buf) < len(expect):
                    left = deadline - time.monotonic()
                    r, _, _ = select.select([self._fd_sel], [], [], max(0.0, left))
                    if not r:
                        self.errors.append(f"timeout waiting for {expect!r}, got {buf!r}")
                        return
                    buf += self._recv(4096)
                got, buf = buf[: len(expect)], buf[len(expect) :]
                if got != expect:
                    self.errors.append(f"expected {expect!r}, got {got!r}")
                    return
                if reply:
                    self._send(reply)
                self.consumed += 1
            # anything more the driver sends is a failure
            while not self._stop.is_set():
                r, _, _ = select.select([self._fd_sel], [], [], 0.02)
                if r:
                    data = self._recv(4096)
                    if not data:
                        break
                    buf += data
            self.extra = buf
        except OSError as exc:
            if not self._stop.is_set():
                self.errors.append(f"I/O error: {exc}")

    def assert_done(self):
        time.sleep(0.05)  # give a wrongly-sent extra request time to arrive
        self._stop.set()
        self.thread.join(STEP_TIMEOUT_S)
        assert not self.thread.is_alive()
        assert self.errors == []
        assert self.consumed == len(self.steps)
        assert self.extra == b""

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(STEP_TIMEOUT_S)
        for fd in (self.master, self.slave):
            if fd >= 0:
                os.close(fd)
        if self._listen is not None:
            self._listen.close()
            if getattr(self, "_conn", None) is not None:
                self._conn.close()
