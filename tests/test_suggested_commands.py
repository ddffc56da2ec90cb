"""Every ``cellcal <command> ...`` the product tells a person to run exists and parses.

The report's empty drift box once said ``cellcal ctl request_drift_check``, a command that does
not exist (``run_drift_check`` does). This test finds every ``cellcal ...`` the product prints
or writes: the string literals of ``cellcal.daemon`` and ``cellcal.testing`` (messages, log
lines, file headers; docstrings are documentation, not output), the text of the HTML report of
every result kind, and the command lines of the README and ``docs/``. For each one naming a
command it runs that command's own argument parser on the suggestion (``{}`` and placeholders
such as ``FILE`` filled with a value the option takes), and for ``ctl`` checks the protocol
command and its ``key=value`` names against the catalogue. A ``cellcal <word>`` where the word is
no command must be prose this file lists (``cellcal database``, ``cellcal result 5``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import html
import importlib
import io
import re
from pathlib import Path

import pytest
from _report_kinds import every_kind, kinematics_kind

from cellcal.daemon import protocol as P
from cellcal.daemon.cli import COMMANDS
from cellcal.daemon.cli.ctl import UsageError, parse_args_list
from cellcal.daemon.report.html import render_report

ROOT = Path(__file__).resolve().parents[1]

#: ``cellcal <word>`` that is prose, not a command: the word and why.
PROSE = {
    "database": "the store's files ('not a cellcal database')",
    "store": "'no cellcal store in DIR'",
    "result": "a file header: 'cellcal result 5 (base_frame, active ...)'",
    "configuration": "'cellcal configuration' in messages",
    "tracker": "'the cellcal tracker protocol'",
    "knows": "'the schema versions this cellcal knows'",
    "version": "'cellcal version' (the package's), not --version",
    "daemon": "'another cellcal daemon (pid ...)'",
    "wire": "'the cellcal wire' (the codec)",
    "starting": "the header 'cellcal starting configuration'",
    "converts": "'cellcal converts to SI on load'",
    "installed": "'cellcal installed' (the package)",
    "fixtures": "the pytest plugin's fixtures",
    "simulated": "'the cellcal simulated cell'",
    "marker": "the pytest marker",
    "running": "'a cellcal running ...'",
    "calibration": "'a cellcal calibration'",
    "package": "'the cellcal package'",
    "repository": "'the cellcal repository'",
    "protocol": "'the cellcal protocol'",
    "python": "'cellcal Python API'",
    "reads": "'cellcal reads once at open'",
}

#: Suggestions that read as a command but are prose, each with the reason.
PROSE_PHRASES = [
    (re.compile(r"^cellcal run \{\}$"), "a station file's header names the run: 'cellcal run 3 (base_frame): ...'"),
    (re.compile(r"^cellcal solve reads\b"), "'cellcal solve reads base_frame ... stations'"),
]

_MATCH = re.compile(r"cellcal (?P<word>[a-z][a-z_-]*)(?P<rest>[^\n`\"]*)")
_PLACEHOLDER = re.compile(r"^(\{\}|[A-Z][A-Z0-9_]*|<[^>]+>|\.\.\.)$")


def _literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string literal of a module but its docstrings; an f-string with
    ``{}`` where a value goes."""
    tree = ast.parse(path.read_text())
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            docs.update(id(v) for v in node.values)
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((node.lineno, node.value))
    return out


def _source_suggestions() -> list[tuple[str, str]]:
    found = []
    for folder in ("daemon",):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, text in _literals(path):
                found += [(f"{path.relative_to(ROOT)}:{line}", m) for m in _matches(text)]
    return found


def _report_suggestions() -> list[tuple[str, str]]:
    found = []
    bodies = {k: b for k, (b, _s) in every_kind(n=8).items()}
    bodies["kinematics"] = kinematics_kind(n_fit=24, n_validation=6)[0]
    for kind, body in bodies.items():
        text = html.unescape(re.sub(r"<[^>]+>", "\n", render_report(body)))
        found += [(f"report of a {kind} result", m) for m in _matches(text)]
    return found


def _doc_suggestions() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if "adr" in path.parts:  # decisions record history: a command may have been renamed since
            continue
        text = path.read_text()
        spans = re.findall(r"`(cellcal [^`]+)`", text)
        spans += [ln.strip() for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", text, re.S)
                  for ln in block.splitlines() if ln.strip().startswith("cellcal ")]
        for s in spans:
            found += [(str(path.relative_to(ROOT)), m) for m in _matches(s.split(" #")[0])]
    return found


def _matches(text: str) -> list[str]:
    """Every ``cellcal <word> ...`` in ``text``, each up to the end of its clause (one inside
    another's clause is found too: '... cellcal ctl run_drift_check; then ... cellcal report')."""
    out = []
    for start in (m.start() for m in re.finditer(r"\bcellcal ", text)):
        m = _MATCH.match(text, start)
        if m is not None:
            out.append(re.split(r"[;()]", m.group(0))[0].rstrip())
    return out


def _tokens(rest: str) -> list[str]:
    """The suggestion's arguments: up to the first token that is prose or punctuation."""
    out = []
    for tok in rest.split():
        tok = tok.rstrip(").,;:")
        if not tok or tok[0] in "([\\|&#" or tok in ("then", "and", "or", "with", "to", "for"):
            break
        if re.fullmatch(r"[a-z]+", tok) and not out:  # 'cellcal solve reads ...': prose after the command
            if tok not in P.COMMANDS:
                break
        out.append(tok)
        if tok != tok.rstrip(";"):
            break
    return out


def _parser(command: str) -> argparse.ArgumentParser:
    module = importlib.import_module(COMMANDS[command][0])
    parser = argparse.ArgumentParser(prog=f"cellcal {command}", exit_on_error=False)
    module.add_arguments(parser)
    return parser


def _fill(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Placeholders replaced by a value the option (or a positional) takes."""
    out = []
    for i, tok in enumerate(argv):
        if "|" in tok and not tok.startswith("-"):
            tok = tok.split("|")[0]  # 'eye_in_hand|eye_to_hand': one of them
        if _PLACEHOLDER.match(tok):
            action = parser._option_string_actions.get(argv[i - 1]) if i else None  # noqa: SLF001 - a test
            choices = list(action.choices) if action is not None and action.choices else None
            tok = str(choices[0]) if choices else "1"
        elif "=" in tok and not tok.startswith("-"):
            key, _, value = tok.partition("=")
            tok = f"{key}={'1' if _PLACEHOLDER.match(value) or not value else value}"
        out.append(tok)
    return out


def _check(where: str, suggestion: str) -> str | None:
    """Why ``suggestion`` is not a command that parses (None when it is, or is prose)."""
    m = _MATCH.match(suggestion)
    assert m is not None
    word, rest = m.group("word"), m.group("rest")
    if any(p.search(suggestion) for p, _why in PROSE_PHRASES):
        return None
    if word not in COMMANDS:
        if word in PROSE or word.startswith("cellcal"):
            return None
        return f"{where}: '{suggestion}': no command {word!r} (commands: {', '.join(COMMANDS)})"
    parser = _parser(word)
    argv = _fill(parser, _tokens(rest))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            message = err.getvalue()
            # --help; or a mention of part of a command ('cellcal sim --instrument emscon'): what
            # it gives must parse, what it leaves out is the reader's to add
            if exc.code == 0 or "arguments are required" in message or re.search(r"one of the arguments .* is required",
                                                                                   message):
                return None
            return f"{where}: '{suggestion}': cellcal {word} does not take {argv}: {message.strip()[-200:]}"
        except argparse.ArgumentError as exc:
            if "expected one argument" in str(exc) and argv and argv[-1].startswith("-"):
                return None  # an option named in prose, its value left out ('cellcal solve --expect-base')
            return f"{where}: '{suggestion}': cellcal {word} does not take {argv}: {exc}"
    if word == "ctl":
        if args.cmd == "1":
            return None  # the command itself is a placeholder ('usage: cellcal ctl {name} ...')
        if args.cmd not in P.COMMANDS:
            return f"{where}: '{suggestion}': no daemon command {args.cmd!r} (commands: {', '.join(P.COMMANDS)})"
        known = {a.name for a in P.COMMANDS[args.cmd].args}
        unknown = [kv.partition("=")[0] for kv in args.args if kv.partition("=")[0] not in known]
        if unknown:
            return f"{where}: '{suggestion}': {args.cmd} takes no argument {unknown} (it takes {sorted(known)})"
        try:
            parse_args_list(args.args, args.json_args, args.cmd)
        except UsageError as exc:
            return f"{where}: '{suggestion}': {exc}"
    return None


def test_the_finder_sees_what_it_must():
    """The product's suggestions are found (so an empty search cannot pass), and the checker
    refuses the command that did not exist and a made-up option."""
    found = {s for _w, s in _source_suggestions()}
    assert "cellcal ctl run_drift_check" in "\n".join(found)
    assert sum(s.startswith("cellcal ") for s in found) > 40, sorted(found)
    assert _check("t", "cellcal ctl request_drift_check") is not None
    assert _check("t", "cellcal show --no-such-option") is not None
    assert _check("t", "cellcal ctl get_result result_idd=1") is not None
    assert _check("t", "cellcal frobnicate --now") is not None
    assert _check("t", "cellcal solve {} --kind {} --estimate-noise") is None
    in_report = {s for _w, s in _report_suggestions()}
    assert {"cellcal ctl run_drift_check", "cellcal report"} <= {s.split(";")[0] for s in in_report}, in_report


@pytest.mark.parametrize("source", ["daemon", "report", "docs"])
def test_every_suggested_command_exists_and_parses(source):
    found = {"daemon": _source_suggestions, "report": _report_suggestions, "docs": _doc_suggestions}[source]()
    problems = sorted({p for where, s in found if (p := _check(where, s)) is not None})
    assert not problems, "\n".join(problems)
