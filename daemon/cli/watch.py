"""``cellcal watch``: the daemon's progress for people, until Ctrl-C.

Joins like any client (subscribe, snapshot, live; see :mod:`cellcal.daemon.wire.client`), so the
first lines are the daemon's current state. Lengths in mm and angles in degrees here, for
people; the wire is SI. Gaps, restarts and silence are reported on stderr.

* A run's stations make a **progress line**: stations done/planned, rejections, elapsed
  time and an estimate of the time left (the mean time per accepted station so far). On a
  terminal it is one bar redrawn in place; piped, one plain line per station. A rejected
  station also gets its own line with the reason.
* **Heartbeats** are summarised: one is printed when what it says changes (state, devices
  up or down, active result, suspect, run); ``--heartbeats`` prints every one.
* A **result** line shows the result's main transform (``cell_T_base``) in mm and degrees
  with its 1-sigma; a **drift** check is said in words (``cellcal.daemon.report.human``).

``--count N`` stops after N messages, ``--duration S`` after S seconds (for scripts).
Exit codes: 0 done (Ctrl-C, count reached, or duration over without --count), 2 bad usage,
3 no daemon answered (no snapshot reply and no message within :data:`NO_ANSWER_S`, or within
the duration when that is shorter; the message says what was tried) or the duration was over
before --count messages arrived. A daemon that answered once and then goes silent (a
restart) is waited for, and said on stderr.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from cellcal.daemon import protocol as P
from cellcal.daemon.cli.ctl import UsageError, add_connection_arguments, make_client
from cellcal.daemon.report import human
from cellcal.daemon.report.reading import as_map, to_float, to_int
from cellcal.daemon.wire.client import Subscription

_SHORT = {t.rsplit("/", 1)[1]: t for t in P.TOPICS}

#: Seconds without any answer (no snapshot reply, no message) after which watch gives up
#: with exit 3: three heartbeat periods of the default configuration.
NO_ANSWER_S = 3.0

EXIT_NO_ANSWER = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p, pub=True)
    p.add_argument("--topics", help=f"comma-separated subset of {','.join(_SHORT)} (default all)")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--json", action="store_true", help="print each envelope as one JSON line instead")
    p.add_argument("--heartbeats", action="store_true",
                   help="print every heartbeat (default: only when what it says changes)")


def _mm(v: object) -> str:
    return f"{v * 1e3:.3f}mm" if isinstance(v, (int, float)) else "-"


def _deg(v: object) -> str:
    return f"{math.degrees(v):.4f}deg" if isinstance(v, (int, float)) else "-"


def _number(v: object, what: str) -> int | float:
    """``v`` where the line does arithmetic with it (TypeError otherwise, as the sum gave)."""
    if isinstance(v, (int, float)):
        return v
    raise TypeError(f"{what}: expected a number, got {type(v).__name__}")


def _describe(name: str, b: Mapping[str, object]) -> str:
    if name == "heartbeat":
        devs = as_map(b.get("devices"), "devices")
        dev = " ".join(f"{k}={'up' if as_map(v, k).get('connected') else 'DOWN'}" for k, v in sorted(devs.items()))
        return (f"state={b.get('state', '?')} up={b.get('uptime_s', 0):.0f}s active={b.get('active_result_id') or '-'}"
                f"{' SUSPECT' if b.get('suspect') else ''} run={b.get('run_id') or '-'} {dev}").rstrip()
    if name == "state":
        return f"{b.get('previous') or '-'} -> {b.get('state', '?')} run={b.get('run_id') or '-'}: {b.get('reason', '')}"
    if name == "station":
        s = as_map(b.get("settle"), "settle")
        verdict = "accepted" if b.get("accepted") else f"REJECTED ({b.get('reason')})"
        if not b.get("accepted") and b.get("outcome") in ("given_up", "dropped"):
            # The station is lost to the run: say so, and why (the message names the figures).
            verdict = (f"{str(b['outcome']).upper().replace('_', ' ')} ({b.get('reason')}): "
                       f"{b.get('message') or b.get('reason')};")
        index = _number(b.get("index", 0), "index")
        return (f"run={b.get('run_id')} {index + 1}/{b.get('planned', '?')} attempt {b.get('attempt', 1)} "
                f"{verdict} rest={s.get('robot_rest_s', 0):.2f}s tracker_std={_mm(s.get('tracker_std_translation_m'))}")
    if name == "result":
        main = human.main_transform(b)
        pose = f" {human.pose_text(b, main)};" if main is not None else ""
        rotation = "" if human.no_rotation_reason(b) is not None else f"/{_deg(b.get('rms_rotation_rad'))}"
        spread = b.get("axis_spread")
        return (f"{b.get('result_id')} {b.get('kind')} {'active' if b.get('active') else 'inactive'}"
                f"{' SUSPECT' if b.get('suspect') else ''}:{pose} rms={_mm(b.get('rms_translation_m'))}{rotation}"
                f"{f' spread={spread:.3f}' if isinstance(spread, (int, float)) else ''}"
                f"{' (retained)' if b.get('retained') else ''}")
    if name == "drift":
        return human.drift_line(b)
    if name == "fault":
        what = "FAULT" if b.get("active", True) else "cleared"
        return f"{what} {b.get('code')} {b.get('device') or 'daemon'}: {b.get('message', '')}"
    return json.dumps(b, default=repr)


def format_message(topic: str, env: Mapping[str, object]) -> str:
    """One line for people: local time, seq, topic, the body's essentials in mm and deg."""
    name = topic.rsplit("/", 1)[-1]
    body = env.get("body") or {}
    try:
        text = _describe(name, as_map(body, "body"))
    except (TypeError, ValueError, AttributeError):  # a body from another version: show it raw
        text = json.dumps(body, default=repr)
    return f"{_prefix(env, name)} {text}"


def _prefix(env: Mapping[str, object], name: str) -> str:
    t = _dt.datetime.fromtimestamp(to_float(env["ts_ns"]) / 1e9).strftime("%H:%M:%S.%f")[:-3]
    return f"{t} #{env['seq']:<6} {name:<9}"


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60:d}:{rem % 60:02d}"


def _heartbeat_summary(b: Mapping[str, object]) -> tuple[object, ...]:
    devs = as_map(b.get("devices"), "devices")
    return (b.get("state"), b.get("active_result_id"), bool(b.get("suspect")), b.get("run_id"),
            tuple(sorted((k, bool(as_map(v, k).get("connected"))) for k, v in devs.items())))


class Progress:
    """A run's progress from its station (and state) messages: done/planned, rejections,
    elapsed and an estimate of the time left. Times are the envelopes' (the daemon's wall
    clock), so a watch that joined late still measures from the first message it saw."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.t0_ns = 0
        self.t_last_ns = 0
        self.done = 0
        self.planned = 0
        self.rejected = 0

    def update(self, body: Mapping[str, object], ts_ns: int) -> None:
        run_id = str(body.get("run_id"))
        if run_id != self.run_id:
            self.run_id, self.t0_ns, self.rejected = run_id, ts_ns, 0
        self.done = to_int(body.get("accepted_count") or 0)
        self.planned = to_int(body.get("planned") or 0)
        if not body.get("accepted"):
            self.rejected += 1
        self.t_last_ns = ts_ns

    def start(self, run_id: str, ts_ns: int) -> None:
        if run_id != self.run_id:
            self.run_id, self.t0_ns, self.t_last_ns, self.done, self.planned, self.rejected = run_id, ts_ns, ts_ns, 0, 0, 0

    def text(self, *, bar_width: int = 0) -> str:
        elapsed = (self.t_last_ns - self.t0_ns) * 1e-9
        left = "?"
        if self.done > 0 and self.planned >= self.done:
            left = "~" + _clock(elapsed / self.done * (self.planned - self.done))
        bar = ""
        if bar_width > 0:
            filled = int(round(bar_width * self.done / self.planned)) if self.planned else 0
            bar = "[" + "#" * filled + "." * (bar_width - filled) + "] "
        return (f"run {self.run_id} {bar}{self.done}/{self.planned or '?'} stations, {self.rejected} rejected, "
                f"{_clock(elapsed)} elapsed, {left} left")


class Printer:
    """Where lines go: plain lines, or on a terminal a progress bar redrawn in place that
    a normal line first moves out of the way."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out, self.tty = out, tty
        self._bar_shown = False

    def line(self, text: str) -> None:
        if self._bar_shown:
            self.out.write("\n")
            self._bar_shown = False
        self.out.write(text + "\n")
        self.out.flush()

    def progress(self, text: str) -> None:
        if not self.tty:
            self.line(text)
            return
        self.out.write("\r\x1b[2K" + text)
        self.out.flush()
        self._bar_shown = True

    def close(self) -> None:
        if self._bar_shown:
            self.out.write("\n")
            self.out.flush()
            self._bar_shown = False


def answered(sub: Subscription, delivered: int) -> bool:
    """Whether the daemon ever answered this watch: a snapshot taken, or a message seen."""
    return sub.snapshots > 0 or delivered > 0 or sub.boot_id is not None


def run(args: argparse.Namespace) -> int:
    try:
        topics = None
        if args.topics:
            names = [t.strip() for t in args.topics.split(",") if t.strip()]
            bad = [n for n in names if n not in _SHORT and n not in P.TOPICS]
            if bad:
                raise UsageError(f"unknown topic(s) {', '.join(bad)} (known: {', '.join(_SHORT)})")
            topics = [_SHORT.get(n, n) for n in names]
        if args.count is not None and args.count < 1:
            raise UsageError("--count must be >= 1")
        if args.duration is not None and args.duration <= 0:
            raise UsageError("--duration must be > 0")
        client = make_client(args, pub=True)
    except UsageError as exc:
        print(f"cellcal watch: {exc}", file=sys.stderr)
        return 2

    def on_gap(expected: int, got: int) -> None:
        print(f"# gap: expected seq {expected}, got {got}; resynchronising", file=sys.stderr, flush=True)

    def on_restart(old: str | None, new: str) -> None:
        print(f"# daemon restarted (boot_id {old} -> {new})", file=sys.stderr, flush=True)

    deadline = time.monotonic() + args.duration if args.duration else None
    n = 0
    warned_silence = False
    printer = Printer(sys.stdout, sys.stdout.isatty())
    progress = Progress()
    last_beat: tuple[object, ...] | None = None
    with client:
        sub = client.subscribe(topics, on_gap=on_gap, on_restart=on_restart)
        try:
            while True:
                wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
                msg = sub.recv(wait)
                if msg is not None:
                    topic, env = msg
                    warned_silence = False
                    if args.json:
                        printer.line(json.dumps({"topic": topic, **env}, default=repr))
                    else:
                        name = topic.rsplit("/", 1)[-1]
                        body = env.get("body") or {}
                        if name == "heartbeat" and not args.heartbeats:
                            summary = _heartbeat_summary(body) if isinstance(body, dict) else None
                            if summary == last_beat:
                                continue  # unchanged: summarised, not printed (nor counted)
                            last_beat = summary
                        if name == "station" and isinstance(body, dict):
                            try:
                                progress.update(body, to_int(env["ts_ns"]))
                            except (TypeError, ValueError):
                                printer.line(format_message(topic, env))
                            else:
                                if not body.get("accepted"):
                                    printer.line(format_message(topic, env))
                                printer.progress(f"{_prefix(env, 'progress')} "
                                                 + progress.text(bar_width=30 if printer.tty else 0))
                        else:
                            if (name == "state" and isinstance(body, dict) and body.get("state") == P.STATE_CAPTURING
                                    and body.get("run_id") is not None):
                                progress.start(str(body["run_id"]), to_int(env.get("ts_ns") or 0))
                            printer.line(format_message(topic, env))
                    n += 1
                    if args.count is not None and n >= args.count:
                        return 0
                elif sub.stale_s() > NO_ANSWER_S and not warned_silence:
                    if not answered(sub, n):
                        print(f"cellcal watch: no daemon answered at {client.pub_endpoint} (commands "
                              f"{client.cmd_endpoint}) within {NO_ANSWER_S:g} s; is the daemon running? "
                              f"{args.tried}", file=sys.stderr, flush=True)
                        return EXIT_NO_ANSWER
                    print(f"# no message for {sub.stale_s():.0f} s from {client.pub_endpoint}; is the daemon running? "
                          f"{args.tried}", file=sys.stderr, flush=True)
                    warned_silence = True
                if deadline is not None and time.monotonic() >= deadline:
                    if not answered(sub, n):
                        print(f"cellcal watch: no daemon answered at {client.pub_endpoint} (commands "
                              f"{client.cmd_endpoint}) in {args.duration:g} s; is the daemon running? {args.tried}",
                              file=sys.stderr, flush=True)
                        return EXIT_NO_ANSWER
                    return EXIT_NO_ANSWER if args.count is not None else 0
        except KeyboardInterrupt:
            return 0
        finally:
            try:
                printer.close()
            except BrokenPipeError:  # `cellcal watch | head`: cli.main exits quietly
                pass
