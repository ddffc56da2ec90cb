"""The command line attacked from outside (issue 24, "no traceback anywhere"), in this process.

* Ids: every command that takes one (``show``, ``report``, ``stations``, ``show --diff``,
  ``ctl``'s ``result_id`` / ``run_id``) reads ASCII digits within the store's range; a 20-digit
  id, an Arabic-Indic digit, ``-1``, ``1e3`` are each a clear error (exit 2) naming the
  argument, before any store or socket is touched; and a fuzz of ids through the real store.
* Output files (``report -o``, ``stations -o``, ``init -o``): a symlink or an existing file is refused unless ``--force``,
  which replaces the link itself, never its target; nothing is left half-written.
* A reader that went away (``cellcal ... | head``): every command that prints ends quietly
  with 141, never a traceback or "internal error".
* ``cellcal watch`` with no daemon exits 3; ``ctl`` and ``check-config`` speak in words by
  default (``--json`` for the JSON).

A real SQLite store in a temporary directory; loopback only (a dead port, never reached).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from _report_kinds import every_kind
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellcal.daemon import cli
from cellcal.daemon.cli import replies
from cellcal.daemon.cli.output import OutputRefused, write_output
from cellcal.daemon.cli.results import MAX_ID, CommandError, parse_id
from cellcal.daemon.store import Store

ROOT = Path(__file__).resolve().parents[1]
DEAD = "tcp://127.0.0.1:9"  # the discard port: nothing listens, nothing is sent (refused first)
HOSTILE_IDS = ["12345678901234567890", "\u0661", "-1", "1e3", "+7", "7.0", "0", "9" * 5000, "\u00b2", "0x10", "", " "]


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    """A store holding one run and one result of each kind (active: the last)."""
    d = tmp_path_factory.mktemp("state")
    with Store(d) as store:
        for kind, (body, _stations) in every_kind(n=8).items():
            run = store.create_run(body["kind"], {"kind": "generated"}, config_sha256="ab" * 32, devices={})
            store.add_result(run, body["kind"], {k: v for k, v in body.items() if k != "result_id"}, {},
                             activate=kind == "tool_point")
    return d


def _cellcal(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# --- ids -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", HOSTILE_IDS)
def test_every_command_refuses_a_hostile_id_naming_the_argument(state, tmp_path, capsys, bad):
    cases = [
        (("show", bad, "--state-dir", str(state)), "RESULT_ID"),
        (("report", bad, "-o", str(tmp_path / "r.html"), "--state-dir", str(state)), "RESULT_ID"),
        (("stations", bad, "-o", str(tmp_path / "s.jsonl"), "--state-dir", str(state)), "RUN_ID"),
        (("show", "--diff", "1", bad, "--state-dir", str(state)), "--diff B"),
        (("show", "--diff", bad, "2", "--state-dir", str(state)), "--diff A"),
        (("ctl", "get_result", f"result_id={bad}", "--endpoint", DEAD, "--timeout", "0.1", "--retries", "0"),
         "result_id"),
        (("ctl", "abort", f"run_id={bad}", "--endpoint", DEAD, "--timeout", "0.1", "--retries", "0"), "run_id"),
        (("ctl", "activate_result", "--json-args", json.dumps({"result_id": bad}), "--endpoint", DEAD,
          "--timeout", "0.1", "--retries", "0"), "result_id"),
    ]
    for argv, name in cases:
        rc, out, err = _cellcal(capsys, *argv)
        assert rc == 2, (argv, rc, err)
        assert name in err and ("ASCII digits" in err or "at most" in err), (argv, err)
        assert "Traceback" not in err and "no reply" not in err, (argv, err)  # refused before any socket
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "s.jsonl").exists()


def test_the_largest_id_reaches_the_store_and_is_simply_not_there(state, capsys):
    rc, _out, err = _cellcal(capsys, "show", str(MAX_ID), "--state-dir", str(state))
    assert rc == 2 and f"no result {MAX_ID}" in err, err
    rc, _out, err = _cellcal(capsys, "stations", f"run_{MAX_ID}", "-o", os.devnull, "--state-dir", str(state))
    assert rc == 2 and f"no run {MAX_ID}" in err, err


@given(st.text(max_size=30) | st.integers(min_value=-(2**70), max_value=2**70).map(str))
def test_fuzz_parse_id_takes_only_ascii_ids_in_the_store_range(text):
    try:
        v = parse_id(text, "RESULT_ID")
    except CommandError as exc:
        assert "RESULT_ID" in str(exc)
        return
    digits = text.strip().strip("'\"").lstrip("#")
    for prefix in ("result_", "result", "run_", "run"):
        if digits.lower().startswith(prefix):
            digits = digits[len(prefix):].strip()
            break
    assert digits.isascii() and digits.isdigit() and 1 <= v <= MAX_ID and v == int(digits)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])  # capsys read each time
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=24))
def test_fuzz_show_and_ctl_ids_end_in_an_answer_not_a_traceback(state, capsys, text):
    """Any id text through the real store (``show``) and ctl's reading of it: exit 0 or 2,
    never an exception (an OverflowError from SQLite was the traceback)."""
    if text.startswith("-"):
        text = " " + text  # argparse would read it as an option: that is argparse's usage error
    rc, _out, err = _cellcal(capsys, "show", text, "--state-dir", str(state))
    assert rc in (0, 2) and "Traceback" not in err, (text, err)
    rc, _out, err = _cellcal(capsys, "ctl", "get_result", f"result_id={text}", "--endpoint", DEAD,
                             "--timeout", "0.05", "--retries", "0")
    assert rc in (2, 3) and "Traceback" not in err, (text, err)  # 3: a name-like id was sent; nothing answered


# --- output files --------------------------------------------------------------------------------


def test_output_refuses_an_existing_file_and_a_symlink_unless_forced(tmp_path):
    target = tmp_path / "precious.toml"
    target.write_text("keep me\n")
    existing = tmp_path / "out.html"
    existing.write_text("old\n")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "nowhere")
    for path, needle in ((existing, "exists"), (link, "symbolic link"), (dangling, "symbolic link"),
                         (tmp_path, "directory")):
        with pytest.raises(OutputRefused, match=needle):
            write_output(path, "new\n", force=False)
    assert existing.read_text() == "old\n" and target.read_text() == "keep me\n"
    assert not (tmp_path / "nowhere").exists()
    # --force replaces the file, and the link itself (its target is never written)
    write_output(existing, "new\n", force=True)
    write_output(link, "new\n", force=True)
    assert existing.read_text() == "new\n" and not link.is_symlink() and link.read_text() == "new\n"
    assert target.read_text() == "keep me\n"
    write_output(tmp_path / "sub" / "fresh.html", b"x", force=False, make_parents=True)
    assert (tmp_path / "sub" / "fresh.html").read_bytes() == b"x"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".cellcal-tmp")]


def test_output_appearing_after_the_check_is_not_replaced(tmp_path, monkeypatch):
    """The check and the write cannot race: a file made between them is kept (link(2) fails)."""
    from cellcal.daemon.cli import output

    path = tmp_path / "raced.html"
    monkeypatch.setattr(output, "check_output", lambda p, force: (Path(p).write_text("theirs\n"), Path(p))[1])
    with pytest.raises(OutputRefused, match="exists"):
        write_output(path, "ours\n", force=False)
    assert path.read_text() == "theirs\n" and [p.name for p in tmp_path.iterdir()] == ["raced.html"]


def test_report_o_refuses_a_symlink_and_an_existing_file_unless_forced(state, tmp_path, capsys):
    target = tmp_path / "etc-passwd"
    target.write_text("root:x:0:0\n")
    link = tmp_path / "report.html"
    link.symlink_to(target)
    rc, _out, err = _cellcal(capsys, "report", "-o", str(link), "--state-dir", str(state))
    assert rc == 2 and "symbolic link" in err and target.read_text() == "root:x:0:0\n", err
    rc, out, err = _cellcal(capsys, "report", "-o", str(link), "--force", "--state-dir", str(state))
    assert rc == 0 and not link.is_symlink() and "<!DOCTYPE html>" in link.read_text(), err
    assert target.read_text() == "root:x:0:0\n"
    rc, _out, err = _cellcal(capsys, "report", "-o", str(link), "--state-dir", str(state))
    assert rc == 2 and "exists; not replaced (--force replaces it)" in err, err


def test_stations_o_and_init_o_refuse_a_symlink_and_an_existing_file_unless_forced(state, tmp_path, capsys):
    target = tmp_path / "precious"
    target.write_text("keep\n")
    link = tmp_path / "s.jsonl"
    link.symlink_to(target)
    # refused before the store's stations are read (run 1 has none: that error would come next)
    rc, _out, err = _cellcal(capsys, "stations", "1", "-o", str(link), "--state-dir", str(state))
    assert rc == 2 and "symbolic link" in err and target.read_text() == "keep\n", err
    rc, _out, err = _cellcal(capsys, "stations", "1", "-o", str(link), "--force", "--state-dir", str(state))
    assert rc == 2 and "has no stations" in err and target.read_text() == "keep\n", err
    conf = tmp_path / "cellcal.toml"
    conf.symlink_to(target)
    rc, _out, err = _cellcal(capsys, "init", "--robot", "sim", "-o", str(conf))
    assert rc == 2 and "symbolic link" in err and target.read_text() == "keep\n", err
    rc, _out, err = _cellcal(capsys, "init", "--robot", "sim", "-o", str(conf), "--force")
    assert rc == 0 and not conf.is_symlink() and "[robot]" in conf.read_text() and target.read_text() == "keep\n"
    rc, _out, err = _cellcal(capsys, "init", "--robot", "sim", "-o", str(conf))
    assert rc == 2 and "exists; not replaced (--force replaces it)" in err, err


# --- broken pipes --------------------------------------------------------------------------------


class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader went away: every write and flush raises BrokenPipeError (no fd)."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


def test_every_printing_command_ends_quietly_when_its_reader_goes_away(state, tmp_path, monkeypatch, capsys):
    demo = str(ROOT / "config" / "demo.toml")
    commands = [
        ["solve", "--synthetic", "8", "--json"], ["solve", "--synthetic", "8"],
        ["solve", "--synthetic", "8", "--kind", "tool_point"],
        ["check-config", demo, "--no-devices"], ["check-config", demo, "--no-devices", "--json"],
        ["ctl", "--help"], ["ctl", "--help", "start_run"], ["solve", "--help"], ["init"], ["init", "--robot", "sim"],
        ["show", "--state-dir", str(state)], ["show", "1", "--state-dir", str(state)],
        ["show", "--diff", "1", "2", "--state-dir", str(state)], ["report", "-o", "-", "--state-dir", str(state)],
        ["stations", "1", "-o", str(tmp_path / "s.jsonl"), "--state-dir", str(state)],
        ["keys", "--out", str(tmp_path / "keys"), "ops"], ["--version"], [],
    ]
    for argv in commands:
        monkeypatch.setattr("sys.stdout", _ClosedPipe())
        rc = cli.main(argv)
        err = capsys.readouterr().err
        assert rc == cli.EXIT_BROKEN_PIPE, (argv, rc, err)
        assert "Traceback" not in err and "internal error" not in err and "BrokenPipe" not in err, (argv, err)


def test_a_command_that_printed_nothing_keeps_its_own_status(capsys):
    assert cli.main(["show", "--state-dir", "/nonexistent-cellcal"]) == 2
    assert "no cellcal store" in capsys.readouterr().err


# --- watch and ctl, for people -------------------------------------------------------------------


def test_watch_exits_3_when_no_daemon_answers(capsys):
    rc, out, err = _cellcal(capsys, "watch", "--endpoint", DEAD, "--cmd-endpoint", DEAD, "--duration", "0.5",
                            "--timeout", "0.2")
    assert rc == 3 and not out and f"no daemon answered at {DEAD}" in err, err


def test_ctl_replies_in_words():
    status = {"id": 1, "ok": True, "result": {"cell": "c1", "state": "IDLE", "uptime_s": 12.3, "heartbeat_s": 1.0,
                                               "devices": {"robot": {"connected": True}, "tracker": {"connected": False}},
                                               "active_result_id": "4", "suspect": False, "run_id": None,
                                               "version": "0.1.0"}}
    assert replies.reply_lines("get_status", status) == [
        "cell c1: IDLE, up 12 s; active result 4; run none; robot connected, tracker NOT CONNECTED; version 0.1.0"]
    body = every_kind(n=8)["base_frame"][0]
    (line,) = replies.reply_lines("get_result", {"ok": True, "result": body})
    assert "cell_T_base = (" in line and "rotation vector (" in line and "rpy" not in line, line
    pose = {"parent_frame": "base", "child_frame": "part", "matrix": [1, 0, 0, 0.1, 0, 0, -1, 0, 0, 1, 0, 0, 0, 0, 0, 1]}
    assert replies.reply_lines("to_base", {"ok": True, "result": {"result_id": "4", "suspect": True, "pose": pose}}) == [
        "base_T_part: (100.000, 0.000, 0.000) mm, rotation vector (90.0000, 0.0000, 0.0000) deg (result 4) "
        "(the result is SUSPECT)"]
    listed = {"ok": True, "result": {"active_result_id": "2", "results": [
        {"result_id": "2", "run_id": "2", "kind": "tool_point", "active": True, "suspect": False, "accepted": True,
         "n_stations": 9, "rms_translation_m": 1e-4, "rms_rotation_rad": 0.0},
        {"result_id": "1", "run_id": "1", "kind": "base_frame", "active": False, "suspect": False, "accepted": False,
         "n_stations": 9, "rms_translation_m": 2e-3, "rms_rotation_rad": 1e-3}]}}
    text = replies.reply_lines("list_results", listed)
    assert text[1].endswith("fit rms 0.100 mm; active") and "GATES FAILED" in text[2] and " / 0.0573 deg" in text[2]
    assert replies.reply_lines("abort", {"ok": False, "error": {"code": "E_STATE", "message": "no run"}}) == [
        "abort refused: E_STATE: no run"]
    assert replies.reply_lines("some_new_command", {"ok": True, "result": {"a": 1}}) == ["a: 1"]


# --- no placeholders -----------------------------------------------------------------------------


def test_summaries_leave_out_what_a_fit_does_not_have(state, capsys):
    """A point base frame and a tool point fit positions only: no rotation RMS of 0, no sigma
    in degrees, no '0 motions'; a kinematics result has no motion count, and says none, not '?'."""
    import html as html_mod
    import re

    from _report_kinds import kinematics_kind

    from cellcal.daemon.report.html import _summary

    kinds = list(every_kind(n=8))
    for rid, kind in enumerate(kinds, start=1):
        rc, out, err = _cellcal(capsys, "show", str(rid), "--state-dir", str(state))
        assert rc == 0, err
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith("residuals")]
        positions_only = kind in ("base_frame_points", "tool_point")
        assert ("rotation RMS n/a" in line) == positions_only and "0.00000 deg" not in line, (kind, line)
    bodies = {k: b for k, (b, _s) in every_kind(n=8).items()}
    bodies["kinematics"] = kinematics_kind(n_fit=24, n_validation=6)[0]
    for kind, body in bodies.items():
        text = html_mod.unescape(re.sub(r"<[^>]+>", "|", _summary(body)))
        assert "?" not in text.split("Frames and units")[0], (kind, text[:400])
        if kind in ("base_frame_points", "tool_point"):
            assert "residual rotation|" in text and "|n/a: " in text and "0 motions" not in text, text[:600]
            assert " deg (noise" not in text, text[:600]
