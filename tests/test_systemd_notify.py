"""sd_notify client against real AF_UNIX datagram sockets (path and abstract namespace).

Every receive has a timeout, so a missing datagram fails the test instead of hanging it.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from cellcal.daemon import sdnotify
from cellcal.daemon.sdnotify import Notifier, watchdog_interval_s

RECV_TIMEOUT_S = 10.0  # only a failing test waits it out


class Receiver:
    """The systemd side: a bound datagram socket that records what arrives."""

    def __init__(self, notify_socket: str, address: str) -> None:
        self.notify_socket = notify_socket  # the $NOTIFY_SOCKET spelling
        self.address = address  # what bind() took
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.settimeout(RECV_TIMEOUT_S)
        # Ask the kernel for the sender's credentials, as systemd does for NotifyAccess=.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(address)

    def recv(self) -> bytes:
        return self.recv_with_pid()[0]

    def recv_with_pid(self) -> tuple[bytes, int | None]:
        creds_size = struct.calcsize("3i")
        data, ancdata, _flags, _addr = self.sock.recvmsg(4096, socket.CMSG_SPACE(creds_size))
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, _uid, _gid = struct.unpack("3i", payload[:creds_size])
        return data, pid

    def assert_nothing_pending(self) -> None:
        self.sock.settimeout(0.05)
        try:
            with pytest.raises(TimeoutError):
                self.sock.recv(4096)
        finally:
            self.sock.settimeout(RECV_TIMEOUT_S)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="cellcal-sdn-") as d:
        yield Path(d)


@pytest.fixture
def path_receiver(short_dir):
    path = str(short_dir / "notify.sock")
    r = Receiver(path, path)
    yield r
    r.close()


@pytest.fixture
def abstract_receiver():
    name = f"cellcal-test-{os.getpid()}-{uuid.uuid4().hex}"
    r = Receiver("@" + name, "\0" + name)
    yield r
    r.close()


@pytest.fixture(params=["path", "abstract"])
def receiver(request, short_dir):
    if request.param == "path":
        path = str(short_dir / "notify.sock")
        r = Receiver(path, path)
    else:
        name = f"cellcal-test-{os.getpid()}-{uuid.uuid4().hex}"
        r = Receiver("@" + name, "\0" + name)
    yield r
    r.close()


@pytest.fixture
def no_notify_env(monkeypatch):
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


# -- what arrives ---------------------------------------------------------------------------


def test_each_message_arrives_exactly(receiver):
    with Notifier(receiver.notify_socket) as n:
        assert n.ready() is True
        assert receiver.recv() == b"READY=1"
        assert n.status("IDLE, result 42 active") is True
        assert receiver.recv() == b"STATUS=IDLE, result 42 active"
        assert n.watchdog() is True
        assert receiver.recv() == b"WATCHDOG=1"
        assert n.stopping() is True
        assert receiver.recv() == b"STOPPING=1"
    receiver.assert_nothing_pending()


def test_notifier_reads_notify_socket_from_the_environment(receiver, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.notify_socket)
    with Notifier() as n:
        assert n.enabled
        assert n.ready()
    assert receiver.recv() == b"READY=1"


def test_sender_credentials_are_our_pid(path_receiver):
    # systemd attributes a datagram by these credentials; NotifyAccess=main accepts only
    # the main pid, so the message must come from the calling process itself.
    with Notifier(path_receiver.notify_socket) as n:
        n.ready()
    data, pid = path_receiver.recv_with_pid()
    assert data == b"READY=1"
    assert pid == os.getpid()


def test_a_separate_process_notifies_through_the_environment(abstract_receiver):
    env = {**os.environ, "NOTIFY_SOCKET": abstract_receiver.notify_socket}
    code = (
        "import sys\n"
        "from cellcal.daemon.sdnotify import Notifier\n"
        "sys.exit(0 if Notifier().ready() else 3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    assert proc.wait(timeout=30) == 0
    data, pid = abstract_receiver.recv_with_pid()
    assert data == b"READY=1"
    assert pid == proc.pid


def test_status_folds_line_breaks(path_receiver):
    with Notifier(path_receiver.notify_socket) as n:
        assert n.status("FAULT: tracker timeout\nretrying in 5 s\r\n")
    assert path_receiver.recv() == b"STATUS=FAULT: tracker timeout retrying in 5 s"


def test_status_is_utf8(path_receiver):
    with Notifier(path_receiver.notify_socket) as n:
        n.status("drift 0.12 mm / 0.01°")
    assert path_receiver.recv() == "STATUS=drift 0.12 mm / 0.01°".encode()


def test_generic_notify_keeps_order_and_formats_values(path_receiver):
    with Notifier(path_receiver.notify_socket) as n:
        assert n.notify(STATUS="FAULT", ERRNO=5, READY=True)
    assert path_receiver.recv() == b"STATUS=FAULT\nERRNO=5\nREADY=1"


def test_reloading_carries_monotonic_usec(path_receiver):
    before_us = time.monotonic_ns() // 1000
    with Notifier(path_receiver.notify_socket) as n:
        assert n.reloading()
    after_us = time.monotonic_ns() // 1000
    first, second = path_receiver.recv().split(b"\n")
    assert first == b"RELOADING=1"
    name, value = second.split(b"=")
    assert name == b"MONOTONIC_USEC"
    assert before_us <= int(value) <= after_us


def test_extend_timeout_in_microseconds(path_receiver):
    with Notifier(path_receiver.notify_socket) as n:
        assert n.extend_timeout(2.5)
    assert path_receiver.recv() == b"EXTEND_TIMEOUT_USEC=2500000"


@pytest.mark.parametrize(
    "fields",
    [{}, {"ready": 1}, {"Status": "x"}, {"STATUS": "a\nb"}, {"STATUS": "a\0b"}, {"_X": 1}],
)
def test_malformed_fields_are_the_callers_bug(fields, path_receiver):
    with Notifier(path_receiver.notify_socket) as n, pytest.raises(ValueError):
        n.notify(**fields)
    path_receiver.assert_nothing_pending()


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        Notifier("/run/x", send_timeout_s=0.0)
    with pytest.raises(ValueError):
        Notifier("/run/x").extend_timeout(0.0)


def test_concurrent_senders_do_not_interleave(path_receiver):
    n_threads, per_thread = 4, 5  # 20 datagrams: more than the default queue of 10
    received: list[bytes] = []

    def drain() -> None:
        for _ in range(n_threads * per_thread):
            received.append(path_receiver.recv())

    drainer = threading.Thread(target=drain)
    drainer.start()
    # a drainer held back by a loaded machine lets the queue fill: senders wait, not fail
    with Notifier(path_receiver.notify_socket, send_timeout_s=10.0) as n:

        def send(i: int) -> None:
            for j in range(per_thread):
                assert n.status(f"thread {i} message {j}")

        senders = [threading.Thread(target=send, args=(i,)) for i in range(n_threads)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(timeout=10)
    drainer.join(timeout=10)
    expected = [
        f"STATUS=thread {i} message {j}".encode()
        for i in range(n_threads)
        for j in range(per_thread)
    ]
    assert sorted(received) == sorted(expected)


# -- disabled and failing -------------------------------------------------------------------


def test_unset_socket_is_a_no_op(no_notify_env, monkeypatch):
    def no_socket(*args, **kwargs):
        raise AssertionError("a disabled Notifier must not create a socket")

    monkeypatch.setattr(sdnotify.socket, "socket", no_socket)
    n = Notifier()
    assert n.notify_socket is None and not n.enabled
    results = [n.ready(), n.status("x"), n.watchdog(), n.stopping(), n.reloading(), n.notify(X=1)]
    assert results == [False] * 6
    n.close()


def test_empty_socket_variable_is_a_no_op(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    n = Notifier()
    assert not n.enabled
    assert n.ready() is False


@pytest.mark.parametrize("value", ["relative/notify", "@", "vsock:2:1234"])
def test_unsupported_socket_names_disable_sending(value, caplog):
    caplog.set_level(logging.DEBUG, logger=sdnotify.__name__)
    n = Notifier(value)
    assert not n.enabled
    assert n.ready() is False
    assert "unsupported" in caplog.text


def test_constructor_does_no_io(monkeypatch):
    def no_socket(*args, **kwargs):
        raise AssertionError("the constructor must not create a socket")

    monkeypatch.setattr(sdnotify.socket, "socket", no_socket)
    n = Notifier("/nonexistent/cellcal/notify.sock")
    assert n.enabled  # configured; whether anyone listens is found out on the first send


def test_missing_socket_returns_false_and_logs_at_debug(short_dir, caplog):
    caplog.set_level(logging.DEBUG, logger=sdnotify.__name__)
    with Notifier(str(short_dir / "never-bound.sock")) as n:
        assert n.ready() is False
        assert n.watchdog() is False
    errors = [r for r in caplog.records if r.name == sdnotify.__name__]
    assert errors and all(r.levelno == logging.DEBUG for r in errors)


def test_vanished_socket_returns_false_then_recovers(short_dir):
    path = str(short_dir / "notify.sock")
    first = Receiver(path, path)
    with Notifier(path) as n:
        assert n.ready() is True
        assert first.recv() == b"READY=1"
        # systemd went away: the socket is closed and its file removed.
        first.close()
        os.unlink(path)
        assert n.watchdog() is False
        assert n.status("still here") is False
        # systemd came back (daemon-reexec re-creates the socket at the same path).
        second = Receiver(path, path)
        try:
            assert n.watchdog() is True
            assert second.recv() == b"WATCHDOG=1"
        finally:
            second.close()


def test_closed_but_not_removed_socket_returns_false(short_dir):
    path = str(short_dir / "notify.sock")
    r = Receiver(path, path)
    r.close()  # the file stays, nobody is bound: ECONNREFUSED
    with Notifier(path) as n:
        assert n.ready() is False


def test_vanished_abstract_socket_returns_false(abstract_receiver):
    n = Notifier(abstract_receiver.notify_socket)
    assert n.ready() is True
    abstract_receiver.close()
    assert n.watchdog() is False
    n.close()


def test_full_queue_does_not_hang_the_caller(path_receiver):
    # A wedged systemd that never reads: sends must fail within the timeout, not block.
    timeout_s = 0.05
    outcomes, slowest_s = [], 0.0
    with Notifier(path_receiver.notify_socket, send_timeout_s=timeout_s) as n:
        for _ in range(200):
            t0 = time.monotonic()
            outcomes.append(n.watchdog())
            slowest_s = max(slowest_s, time.monotonic() - t0)
            if not outcomes[-1]:
                break
    assert outcomes[0] is True
    assert outcomes[-1] is False
    assert slowest_s < timeout_s + 1.0


# -- watchdog interval ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "1500000"}, 1.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4243"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "pid"}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "0"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({"WATCHDOG_USEC": ""}, None),
        ({"WATCHDOG_PID": "4242"}, None),
    ],
)
def test_watchdog_interval(env, expected):
    assert watchdog_interval_s(env, pid=4242) == expected


def test_watchdog_interval_from_process_environment(monkeypatch, no_notify_env):
    n = Notifier()
    assert n.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert n.watchdog_interval_s() == 30.0
    assert watchdog_interval_s() == 30.0
    # A child that inherited the environment must not ping on the parent's behalf.
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert n.watchdog_interval_s() is None
