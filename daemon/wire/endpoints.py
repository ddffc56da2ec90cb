"""Loopback endpoints: a free TCP port on 127.0.0.1 for a ZeroMQ endpoint or a simulator.

``cellcal demo`` picks its daemon's endpoints with it, and the test harness
(``cellcal.testing``) every port it needs.
"""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_port_rng = random.Random()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Chosen at random *below* the kernel's ephemeral range: a port the OS picks with bind(0)
    comes from that range, which every outgoing connection on the machine also draws its
    local port from, so by the time the daemon binds it a client socket may hold it (seen:
    ``Address already in use`` on a loaded CI machine). Below the range only another
    listener can take it, and the random draw makes two concurrent suites unlikely to meet.
    """
    high = max(_ephemeral_low() - 1, 20001)
    for _ in range(200):
        port = _port_rng.randint(20000, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range: the OS's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
