"""``cellcal watch``: one line per message from the daemon, until Ctrl-C.

Joins like any client (subscribe, snapshot, live; see :mod:`cellcal.daemon.client`), so the
first lines are the daemon's current state. Lengths in mm and angles in degrees here, for
people; the wire is SI. Gaps, restarts and silence are reported on stderr.

``--count N`` stops after N messages, ``--duration S`` after S seconds (for scripts).
Exit codes: 0 done (Ctrl-C, count reached, or duration over without --count), 2 bad usage,
3 duration over before --count messages arrived.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
from typing import Any

from cellcal.daemon import protocol as P
from cellcal.daemon.cmd_ctl import UsageError, add_connection_arguments, make_client

_SHORT = {t.rsplit("/", 1)[1]: t for t in P.TOPICS}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p, pub=True)
    p.add_argument("--topics", help=f"comma-separated subset of {','.join(_SHORT)} (default all)")
    p.add_argument("--count", type=int, help="stop after this many messages")
    p.add_argument("--duration", type=float, help="stop after this many seconds")
    p.add_argument("--json", action="store_true", help="print each envelope as one JSON line instead")


def _mm(v: Any) -> str:
    return f"{v * 1e3:.3f}mm" if isinstance(v, (int, float)) else "-"


def _deg(v: Any) -> str:
    return f"{math.degrees(v):.4f}deg" if isinstance(v, (int, float)) else "-"


def _describe(name: str, b: dict[str, Any]) -> str:
    if name == "heartbeat":
        devs = b.get("devices") or {}
        dev = " ".join(f"{k}={'up' if (v or {}).get('connected') else 'DOWN'}" for k, v in sorted(devs.items()))
        return (f"state={b.get('state', '?')} up={b.get('uptime_s', 0):.0f}s active={b.get('active_result_id') or '-'}"
                f"{' SUSPECT' if b.get('suspect') else ''} run={b.get('run_id') or '-'} {dev}").rstrip()
    if name == "state":
        return f"{b.get('previous') or '-'} -> {b.get('state', '?')} run={b.get('run_id') or '-'}: {b.get('reason', '')}"
    if name == "station":
        s = b.get("settle") or {}
        verdict = "accepted" if b.get("accepted") else f"REJECTED ({b.get('reason')})"
        return (f"run={b.get('run_id')} {b.get('index', 0) + 1}/{b.get('planned', '?')} attempt {b.get('attempt', 1)} "
                f"{verdict} rest={s.get('robot_rest_s', 0):.2f}s tracker_std={_mm(s.get('tracker_std_translation_m'))}")
    if name == "result":
        return (f"{b.get('result_id')} {b.get('kind')} {'active' if b.get('active') else 'inactive'}"
                f"{' SUSPECT' if b.get('suspect') else ''} rms={_mm(b.get('rms_translation_m'))}/"
                f"{_deg(b.get('rms_rotation_rad'))} spread={b.get('axis_spread', float('nan')):.3f}"
                f"{' (retained)' if b.get('retained') else ''}")
    if name == "drift":
        c = b.get("cusum") or {}
        return (f"{b.get('result_id')} {str(b.get('status', '?')).upper()} dev={_mm(b.get('deviation_translation_m'))}/"
                f"{_deg(b.get('deviation_rotation_rad'))} (warn {_mm(b.get('warn_translation_m'))} fail "
                f"{_mm(b.get('fail_translation_m'))}) cusum={_mm(c.get('value_m'))}/{_mm(c.get('h_m'))} "
                f"action={b.get('action', '-')}")
    if name == "fault":
        what = "FAULT" if b.get("active", True) else "cleared"
        return f"{what} {b.get('code')} {b.get('device') or 'daemon'}: {b.get('message', '')}"
    return json.dumps(b, default=repr)


def format_message(topic: str, env: dict[str, Any]) -> str:
    """One line for people: local time, seq, topic, the body's essentials in mm and deg."""
    t = _dt.datetime.fromtimestamp(env["ts_ns"] / 1e9).strftime("%H:%M:%S.%f")[:-3]
    name = topic.rsplit("/", 1)[-1]
    body = env.get("body") or {}
    try:
        text = _describe(name, body)
    except (TypeError, ValueError, AttributeError):  # a body from another version: show it raw
        text = json.dumps(body, default=repr)
    return f"{t} #{env['seq']:<6} {name:<9} {text}"


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
    with client:
        sub = client.subscribe(topics, on_gap=on_gap, on_restart=on_restart)
        try:
            while True:
                wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
                msg = sub.recv(wait)
                if msg is not None:
                    topic, env = msg
                    line = json.dumps({"topic": topic, **env}, default=repr) if args.json else format_message(topic, env)
                    print(line, flush=True)
                    warned_silence = False
                    n += 1
                    if args.count is not None and n >= args.count:
                        return 0
                elif sub.stale_s() > 3.0 and not warned_silence:
                    print(f"# no message for {sub.stale_s():.0f} s from {client.pub_endpoint}; is the daemon running? "
                          f"{args.tried}", file=sys.stderr, flush=True)
                    warned_silence = True
                if deadline is not None and time.monotonic() >= deadline:
                    return 3 if args.count is not None else 0
        except KeyboardInterrupt:
            return 0
        except BrokenPipeError:  # `cellcal watch | head`
            return 0
