"""The systemd unit and sysusers snippet: required keys, `systemd-analyze verify`, sysusers.

`systemd-analyze` comes from Debian's ``systemd`` package, which ``make os-deps`` (run by
``make test``) installs. The tests never install anything: a missing tool fails them with
the command that provides it, never a silent skip.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd" / "cellcal.service"
SYSUSERS = REPO / "systemd" / "cellcal.sysusers.conf"
SHIPPED_EXEC = "/usr/bin/cellcal"
TOOLS = ("systemd-analyze", "systemd-sysusers")
# systemd may live outside a minimal PATH (CI images with a trimmed environment).
TOOL_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin", "/bin", "/usr/sbin", "/sbin"])
# `systemd-analyze security` exposure (0-100; the unit scores 21 = "2.1 OK"). Loosening the
# hardening past this fails the suite instead of passing unnoticed.
MAX_EXPOSURE = 25


# -- finding the tools -----------------------------------------------------------------------


def find_tool(name: str, search_path: str = TOOL_PATH) -> str:
    """Path of ``name``; fails the calling test (never skips) when it is not installed."""
    found = shutil.which(name, path=search_path)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make os-deps` (as root it installs the OS packages the suite needs)")
    return found


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    return find_tool("systemd-analyze")


@pytest.fixture(scope="session")
def systemd_sysusers(systemd_analyze) -> str:
    # Debian 12 ships it in the systemd package; later releases may split it out.
    found = shutil.which("systemd-sysusers", path=TOOL_PATH)
    if found is None:
        pytest.skip("systemd-sysusers is not part of the installed systemd package")
    return found


def test_a_missing_tool_fails_and_names_the_fix(tmp_path):
    # What stands between a machine without systemd and a silent skip: an empty PATH.
    with pytest.raises(pytest.fail.Exception) as failure:
        find_tool("systemd-analyze", search_path=str(tmp_path))
    assert "systemd-analyze is not installed" in str(failure.value)
    assert "make os-deps" in str(failure.value)


# -- reading the unit -----------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file as ordered ``(key, value)`` lists (keys may repeat)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"continuation lines are not expected: {raw!r}"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"assignment before any section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not an assignment: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, list[tuple[str, str]]]:
    return parse_unit(UNIT.read_text())


def values(unit, section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def single(unit, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= set {len(found)} times: {found}"
    return found[0]


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("ExecStart", f"{SHIPPED_EXEC} run --config /etc/cellcal/cellcal.toml"),
        ("WatchdogSec", "30"),
        ("Restart", "on-failure"),
        ("RestartSec", "5"),
        ("TimeoutStopSec", "30"),
        ("User", "cellcal"),
        ("Group", "cellcal"),
        ("StateDirectory", "cellcal"),
        ("RuntimeDirectory", "cellcal"),
        ("ConfigurationDirectory", "cellcal"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("DevicePolicy", "closed"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallFilter", "@system-service"),
        ("SystemCallArchitectures", "native"),
        ("UMask", "0027"),
        ("StateDirectoryMode", "0750"),
        ("RuntimeDirectoryMode", "0750"),
    ],
)
def test_service_key(unit, key, expected):
    # single(): a later assignment would silently override (or, for list settings such as
    # CapabilityBoundingSet=, re-extend) the value checked here.
    assert single(unit, "Service", key) == expected


def test_serial_adapters_are_the_only_physical_devices(unit):
    assert sorted(values(unit, "Service", "DeviceAllow")) == ["char-ttyACM rw", "char-ttyUSB rw"]
    # PrivateDevices=yes would hide the adapters behind a private /dev.
    assert values(unit, "Service", "PrivateDevices") in ([], ["no"])


def test_address_families(unit):
    families = single(unit, "Service", "RestrictAddressFamilies").split()
    assert sorted(families) == sorted(["AF_UNIX", "AF_INET", "AF_INET6", "AF_CAN", "AF_NETLINK"])


def test_stable_user_with_serial_group(unit):
    assert values(unit, "Service", "DynamicUser") in ([], ["no"])
    assert "dialout" in " ".join(values(unit, "Service", "SupplementaryGroups")).split()


def test_tty_drivers_load_before_device_groups_resolve(unit):
    # DeviceAllow=char-<group> only covers groups present in /proc/devices at start-up.
    for module in ("usbserial", "cdc_acm"):
        loader = f"modprobe@{module}.service"
        assert loader in " ".join(values(unit, "Unit", "Wants")).split()
        assert loader in " ".join(values(unit, "Unit", "After")).split()


def test_install_section(unit):
    assert single(unit, "Install", "WantedBy") == "multi-user.target"


# -- systemd-analyze ------------------------------------------------------------------------


def venv_cellcal() -> Path:
    script = Path(sys.executable).parent / "cellcal"
    assert script.is_file() and os.access(script, os.X_OK), f"no cellcal script at {script}"
    return script


def unit_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointed at the venv's script (verify checks it is executable)."""
    text = UNIT.read_text() if text is None else text
    assert text.count(f"ExecStart={SHIPPED_EXEC} ") == 1
    copy = tmp_path / "cellcal.service"
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={venv_cellcal()} "))
    return copy


def verify(systemd_analyze: str, unit_file: Path) -> subprocess.CompletedProcess:
    # --man=no: no man-page lookups for Documentation= (none here; keeps it offline and fast).
    return subprocess.run(
        [systemd_analyze, "verify", "--man=no", str(unit_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def lines_about(output: str, unit_file: Path) -> list[str]:
    return [ln for ln in output.splitlines() if unit_file.name in ln or str(unit_file) in ln]


def test_systemd_analyze_verify(systemd_analyze, tmp_path):
    copy = unit_copy(tmp_path)
    proc = verify(systemd_analyze, copy)
    output = proc.stdout + proc.stderr
    print(f"systemd-analyze verify (exit {proc.returncode}):\n{output or '(no output)'}")
    # verify exits 0 even for unknown keys or unparsable values (it only warns), so the
    # output is checked too. User=cellcal need not exist on the test machine: verify does not
    # resolve users (checked: no message about it).
    assert proc.returncode == 0, output
    assert lines_about(output, copy) == [], output


def test_verify_catches_what_the_check_above_relies_on(systemd_analyze, tmp_path):
    # The assertion above is only worth something if verify reports these mistakes.
    broken = UNIT.read_text()
    broken = broken.replace("LockPersonality=yes", "LockPersonalty=yes")
    broken = broken.replace("DeviceAllow=char-ttyACM rw", "DeviceAllow=ttyACM rw")
    copy = unit_copy(tmp_path, broken)
    proc = verify(systemd_analyze, copy)
    complaints = lines_about(proc.stdout + proc.stderr, copy)
    assert any("LockPersonalty" in ln for ln in complaints), complaints
    assert any("ttyACM" in ln for ln in complaints), complaints


def test_shipped_unit_only_lacks_the_installed_binary(systemd_analyze, tmp_path):
    # The file as shipped, unmodified: its only possible complaint is a missing
    # /usr/bin/cellcal on a machine where cellcal is not installed there.
    shipped = tmp_path / "cellcal.service"
    shutil.copyfile(UNIT, shipped)
    proc = verify(systemd_analyze, shipped)
    complaints = lines_about(proc.stdout + proc.stderr, shipped)
    if Path(SHIPPED_EXEC).exists():
        assert (proc.returncode, complaints) == (0, [])
    else:
        assert len(complaints) == 1 and SHIPPED_EXEC in complaints[0], complaints


def test_exposure_score_stays_low(systemd_analyze, tmp_path):
    copy = unit_copy(tmp_path)
    proc = subprocess.run(
        [
            systemd_analyze, "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}",
            "--no-pager", str(copy),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    summary = [ln for ln in proc.stdout.splitlines() if "Overall exposure" in ln]
    print("\n".join(summary))
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- MemoryDenyWriteExecute=yes against the real imports ------------------------------------

# systemd implements MemoryDenyWriteExecute= as a seccomp filter that fails with EPERM:
# mmap with PROT_WRITE|PROT_EXEC, mprotect/pkey_mprotect with PROT_EXEC, shmat with SHM_EXEC
# (systemd.exec(5)). The same filter is installed here in classic BPF, then the daemon's
# dependencies are imported and exercised in that process.
_MDWE_ARCH = {
    # machine: (AUDIT_ARCH, mmap, mprotect, pkey_mprotect, shmat)
    "x86_64": (0xC000003E, 9, 10, 329, 30),
    "aarch64": (0xC00000B7, 222, 226, 288, 196),
}

_MDWE_PROGRAM = textwrap.dedent(
    """
    import ctypes, mmap, struct, sys

    AUDIT_ARCH, NR_MMAP, NR_MPROTECT, NR_PKEY_MPROTECT, NR_SHMAT = {numbers}
    PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
    LD, AND, JEQ, RET = 0x20, 0x54, 0x15, 0x06           # BPF_LD|W|ABS, ALU|AND|K, JMP|JEQ|K
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1             # SECCOMP_RET_ALLOW, ERRNO(EPERM)
    OFF_NR, OFF_ARCH, OFF_ARG2 = 0, 4, 16 + 8 * 2          # struct seccomp_data (low word)

    prog = [(LD, 0, 0, OFF_ARCH), (JEQ, 1, 0, AUDIT_ARCH), (RET, 0, 0, DENY)]
    for nr, mask in [(NR_MMAP, PROT_WRITE | PROT_EXEC), (NR_MPROTECT, PROT_EXEC),
                     (NR_PKEY_MPROTECT, PROT_EXEC), (NR_SHMAT, SHM_EXEC)]:
        prog += [(LD, 0, 0, OFF_NR), (JEQ, 0, 5, nr), (LD, 0, 0, OFF_ARG2), (AND, 0, 0, mask),
                 (JEQ, 0, 1, mask), (RET, 0, 0, DENY), (RET, 0, 0, ALLOW)]
    prog.append((RET, 0, 0, ALLOW))
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    fprog = SockFprog(len(prog), ctypes.cast(code, ctypes.c_void_p))
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0):
        sys.exit(f"cannot install the seccomp filter: errno {{ctypes.get_errno()}}")

    # The filter must bite, or the rest proves nothing.
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except PermissionError:
        pass
    else:
        sys.exit("W+X mapping was allowed: the filter is not active")

    import sqlite3, tempfile
    import numpy as np, zmq, msgpack, serial, can, canopen
    import cellcal.daemon.cli, cellcal.daemon.sdnotify, cellcal.solver
    import cellcal.drivers.tracker, cellcal.drivers.ur_rtde, cellcal.drivers.canopen402

    rng = np.random.default_rng(0)
    a = rng.standard_normal((400, 400))
    spd = a @ a.T + 400 * np.eye(400)                      # OpenBLAS gemm, threaded
    np.linalg.svd(spd); np.linalg.eigh(spd); np.linalg.solve(spd, a)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB); pub.bind("tcp://127.0.0.1:*"); pub.close(linger=0); ctx.term()
    assert msgpack.unpackb(msgpack.packb({{"v": 1}})) == {{"v": 1}}
    with tempfile.TemporaryDirectory() as d:
        db = sqlite3.connect(d + "/store.sqlite"); db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (x)"); db.commit(); db.close()
    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x + 1)  # libffi closure
    assert callback(1) == 2
    print("MDWE OK")
    """
)


def test_memory_deny_write_execute_keeps_the_daemon_importable(tmp_path):
    numbers = _MDWE_ARCH.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no syscall table for {platform.machine()} in this test")
    script = tmp_path / "mdwe.py"
    script.write_text(_MDWE_PROGRAM.format(numbers=numbers))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0 and "MDWE OK" in proc.stdout, proc.stdout + proc.stderr


# -- sysusers -------------------------------------------------------------------------------


def seeded_root(root: Path) -> Path:
    """A file-system root with only root and the distribution's dialout group."""
    etc = root / "etc"
    etc.mkdir(parents=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\ndialout:x:20:\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (etc / "gshadow").write_text("root:*::\ndialout:*::\n")
    for name in ("shadow", "gshadow"):
        (etc / name).chmod(0o640)
    return root


def sysusers(tool: str, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool, f"--root={root}", *extra, str(SYSUSERS)], capture_output=True, text=True, timeout=60
    )


def read_db(path: Path) -> dict[str, list[str]]:
    return {line.split(":")[0]: line.split(":") for line in path.read_text().splitlines() if line}


def test_sysusers_dry_run_would_create_the_user(systemd_sysusers, tmp_path):
    root = seeded_root(tmp_path / "root")
    before = {p.name: p.read_bytes() for p in (root / "etc").iterdir()}
    proc = sysusers(systemd_sysusers, root, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    messages = proc.stdout + proc.stderr
    assert "Creating group 'cellcal'" in messages, messages
    assert "Creating user 'cellcal'" in messages, messages
    assert {p.name: p.read_bytes() for p in (root / "etc").iterdir()} == before


def test_sysusers_creates_a_system_user_in_dialout(systemd_sysusers, tmp_path):
    root = seeded_root(tmp_path / "root")
    proc = sysusers(systemd_sysusers, root)
    assert proc.returncode == 0, proc.stderr
    passwd = read_db(root / "etc" / "passwd")
    group = read_db(root / "etc" / "group")
    _name, _pw, uid, gid, _gecos, home, shell = passwd["cellcal"]
    assert 0 < int(uid) < 1000, "a system user (SYS_UID_MAX is 999 on Debian)"
    assert group["cellcal"][2] == gid, "primary group is the same-named group"
    assert home == "/var/lib/cellcal"
    assert shell.endswith("nologin")
    assert "cellcal" in group["dialout"][3].split(",")
    assert group["dialout"][2] == "20", "the existing dialout group is reused, not re-created"
    # Idempotent: a second run (every boot, every package upgrade) changes nothing.
    snapshot = {p.name: p.read_bytes() for p in (root / "etc").iterdir()}
    proc = sysusers(systemd_sysusers, root)
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in (root / "etc").iterdir()} == snapshot
