"""Helpers of the GigE Vision tests: loopback addresses per worker, Aravis's tools.

GVCP's port is fixed (3956) and the suite runs in parallel, so every simulated camera gets
a loopback address of its own: 127.<60 + worker>.<pid-derived>.<n>, the bind checked and
the next one tried if taken (another session on the machine may run the same tests). Aravis's
fake camera can serve on an address only if an interface holds it, and only 127.0.0.1 does:
its tests wait for 127.0.0.1:3956 to be free and fail, naming who to blame, if it never is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.gige_link import GvcpClient
from cellcal.sim.gige_device import GigeDevice

TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin"])
#: Debian package of each tool the tests run (all in the Makefile's OS_PACKAGES).
PACKAGES = {"arv-fake-gv-camera-0.8": "aravis-tools", "arv-tool-0.8": "aravis-tools-cli",
            "arv-camera-test-0.8": "aravis-tools", "strace": "strace"}


def find_tool(name: str) -> str:
    """Path of ``name``; fails the calling test (never skips) when it is not installed."""
    found = shutil.which(name, path=TOOL_PATH)
    if found is None:
        pytest.fail(f"{name} (Debian package {PACKAGES.get(name, '?')}) is not installed: run `make os-deps` "
                    "(as root it installs the OS packages the suite needs)")
    return found


def loopback_candidates() -> Iterator[str]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    third = os.getpid() % 200 + 20
    for last in range(2, 255):
        yield f"127.{60 + n % 100}.{third}.{last}"


def start_sim(**kwargs) -> GigeDevice:
    """A started :class:`GigeDevice` on the first free loopback address of this worker."""
    last: OSError | None = None
    for address in loopback_candidates():
        dev = GigeDevice(address, **kwargs)
        try:
            return dev.start()
        except OSError as exc:  # taken: the next one
            last = exc
    raise AssertionError(f"no free loopback address for a simulated camera ({last})")


@contextlib.contextmanager
def sim_process(*args: str):
    """``python -m cellcal.sim.gige_device`` in a process of its own on a free loopback
    address of this worker; yields the address, and stops the process on exit."""
    import sys

    for address in loopback_candidates():
        proc = subprocess.Popen([sys.executable, "-m", "cellcal.sim.gige_device", "--address", address, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "serving ..." once bound, nothing if it exited
        if line.startswith("serving"):
            break
        proc.wait(timeout=10)
        if "Address already in use" not in (proc.stderr.read() if proc.stderr else ""):
            raise AssertionError(f"the simulated camera did not start on {address}: {line!r}")
    else:
        raise AssertionError("no free loopback address for a simulated camera process")
    try:
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _port_free(address: str, port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((address, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def answers_gvcp(host: str, timeout_s: float = 0.5) -> bool:
    client = GvcpClient(host, gc.GVCP_PORT, ack_timeout_s=0.1, retries=0)
    client.open()
    try:
        client.read_reg(gc.Reg.CCP, time.monotonic() + timeout_s)
        return True
    except Exception:  # noqa: BLE001 - any failure is "not yet"
        return False
    finally:
        client.close()


@contextlib.contextmanager
def fake_camera(serial: str = "CELLCAL01", lost_per_thousand: int = 0, wait_free_s: float = 120.0):
    """Aravis's ``arv-fake-gv-camera-0.8`` on 127.0.0.1:3956, stopped on exit."""
    exe = find_tool("arv-fake-gv-camera-0.8")
    deadline = time.monotonic() + wait_free_s
    while not _port_free("127.0.0.1", gc.GVCP_PORT):
        if time.monotonic() > deadline:
            raise AssertionError("127.0.0.1:3956 stayed taken (another fake camera or GigE Vision device?)")
        time.sleep(0.2)
    cmd = [exe, "-i", "127.0.0.1", "-s", serial]
    if lost_per_thousand:
        cmd += ["-r", str(lost_per_thousand)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20.0
        while not answers_gvcp("127.0.0.1"):
            if proc.poll() is not None:
                raise AssertionError(f"arv-fake-gv-camera-0.8 exited {proc.returncode}: {proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError("arv-fake-gv-camera-0.8 did not answer GVCP on 127.0.0.1:3956")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
