"""Install Debian packages a test needs, as the issue asks for systemd: never skip instead.

CI runs as root on a Debian machine whose package mirrors are reachable; a developer machine
without root gets a failure that says what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

APT_TIMEOUT_S = 600


def ensure_debian_packages(packages: list[str], present) -> None:
    """Make ``present()`` true by installing ``packages`` with apt-get, or fail the test."""
    if present():
        return
    what = " ".join(packages)
    if os.geteuid() != 0:
        pytest.fail(f"missing, and not root to install them: apt-get install -y {what}")
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.fail(f"missing and no apt-get to install them with: {what}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (["update"], ["install", "-y", "--no-install-recommends", *packages]):
        try:
            proc = subprocess.run([apt, *args], capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"apt-get {' '.join(args)} timed out ({APT_TIMEOUT_S} s)")
        if proc.returncode != 0:
            pytest.fail(f"apt-get {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    if not present():
        pytest.fail(f"apt-get installed {what} but the test still cannot find them")
