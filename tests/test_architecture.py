"""The architecture as rules a change cannot break silently (ADR 0018).

* **Floors**: imports point down. ``cellcal.solver`` imports nothing of ours; drivers only the
  solver; the simulator the solver and drivers; the daemon never the public test harness
  (``cellcal.testing``) but through the one re-export kept for older importers. Inside the
  daemon: the wire's vocabulary imports nothing above it, the configuration and the store
  nothing of the service's machinery, the run kinds never the jobs, the service, the
  transports or the command line, the jobs never the command line or the assembly.
* **No module cycles**, counting every import a module makes when it is imported (its
  module-level imports), whatever package it is in.
* **Function-level imports** only where a dependency is optional or the simulator is loaded
  lazily, each with a comment saying why.
* **Sizes**: no module of the daemon over 1,000 lines; the service at most 600.
* **Run kinds**: no ``KIND_*`` constant outside the protocol's vocabulary and the run kinds'
  package; every kind the protocol names is registered.
* **No ``Any``** in the daemon or the test harness (mypy's ``disallow_any_explicit`` checks the
  annotations it expands too: a bare ``np.ndarray``'s defaults, ``Callable[..., T]``), and
  never in the annotations of a public function or method of the daemon.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Source folder -> the package it installs as (pyproject's package-dir).
PACKAGES = {"solver": "cellcal.solver", "drivers": "cellcal.drivers", "sim": "cellcal.sim",
            "daemon/testing": "cellcal.testing", "daemon": "cellcal.daemon"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    for folder, pkg in PACKAGES.items():
        if rel.as_posix().startswith(folder + "/"):
            inner = rel.relative_to(folder).with_suffix("")
            parts = [p for p in inner.parts if p != "__init__"]
            return ".".join([pkg, *parts])
    raise ValueError(path)


def _sources() -> Iterator[tuple[str, Path]]:
    for folder in ("solver", "drivers", "sim", "daemon"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield _module_name(path), path


MODULES = dict(_sources())


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports executed when the module is imported (module body, try/if blocks; not
    function bodies, not ``if TYPE_CHECKING:``)."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody)
            for h in node.handlers:
                stack.extend(h.body)


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The cellcal modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("cellcal.")]
    if node.level:
        raise AssertionError(f"{module}: relative import (use the absolute cellcal.* name)")
    base = node.module or ""
    if not base.startswith("cellcal."):
        return []
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in MODULES else base)
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        deps: set[str] = set()
        for node in _module_level_imports(tree):
            for t in _targets(node, name):
                # importing a.b.c imports a.b's __init__ too
                # Importing a.b.c imports a.b's __init__ too; a module's own ancestors are
                # already being imported when it runs, so they are no edge of its own.
                parts = t.split(".")
                for k in range(2, len(parts) + 1):
                    prefix = ".".join(parts[:k])
                    if prefix in MODULES and prefix != name and not name.startswith(prefix + "."):
                        deps.add(prefix)
        graph[name] = deps
    return graph


GRAPH = _graph()


def test_there_is_no_module_cycle():
    state: dict[str, int] = {}
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(GRAPH.get(m, ())):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:10])


#: (importer prefix, forbidden import prefixes, exceptions (module names allowed anyway)).
FLOORS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("cellcal.solver", ("cellcal.drivers", "cellcal.sim", "cellcal.daemon", "cellcal.testing"), ()),
    ("cellcal.drivers", ("cellcal.sim", "cellcal.daemon", "cellcal.testing"), ()),
    ("cellcal.sim", ("cellcal.daemon", "cellcal.testing"), ()),
    ("cellcal.daemon", ("cellcal.testing",), ("cellcal.daemon.harness",)),
    ("cellcal.daemon.wire.vocabulary", ("cellcal.daemon",), ()),
    ("cellcal.daemon.wire.commands", ("cellcal.daemon.",), ("cellcal.daemon.wire.vocabulary",)),
    ("cellcal.daemon.wire.codec", ("cellcal.daemon.",), ("cellcal.daemon.wire.vocabulary", "cellcal.daemon.wire.commands")),
    ("cellcal.daemon.wire.types", ("cellcal.daemon.",), ("cellcal.daemon.wire.vocabulary", "cellcal.daemon.wire.commands")),
    ("cellcal.daemon.config", ("cellcal.daemon.runs", "cellcal.daemon.jobs", "cellcal.daemon.service",
                               "cellcal.daemon.app", "cellcal.daemon.cli", "cellcal.daemon.store", "cellcal.daemon.report",
                               "cellcal.daemon.capture", "cellcal.daemon.devices"), ()),
    ("cellcal.daemon.store", ("cellcal.daemon.runs", "cellcal.daemon.jobs", "cellcal.daemon.service",
                              "cellcal.daemon.app", "cellcal.daemon.cli", "cellcal.daemon.report",
                              "cellcal.daemon.capture", "cellcal.daemon.devices", "cellcal.daemon.config"), ()),
    ("cellcal.daemon.runs", ("cellcal.daemon.jobs", "cellcal.daemon.service", "cellcal.daemon.app",
                             "cellcal.daemon.cli", "cellcal.daemon.wire.zmq_server", "cellcal.daemon.wire.client",
                             "cellcal.daemon.zmq_glue", "cellcal.daemon.plant"), ()),
    ("cellcal.daemon.jobs", ("cellcal.daemon.cli", "cellcal.daemon.app", "cellcal.daemon.service",
                             "cellcal.daemon.zmq_glue", "cellcal.daemon.wire.zmq_server"), ()),
    ("cellcal.daemon.report", ("cellcal.daemon.jobs", "cellcal.daemon.service", "cellcal.daemon.app",
                               "cellcal.daemon.cli"), ()),
]


@pytest.mark.parametrize("importer,forbidden,allowed", FLOORS, ids=[f[0] for f in FLOORS])
def test_imports_point_down(importer, forbidden, allowed):
    bad = []
    for m, deps in GRAPH.items():
        if not (m == importer or m.startswith(importer + ".")) or m in allowed:
            continue
        for d in deps:
            if d in allowed:
                continue
            if any(d == f or d.startswith(f if f.endswith(".") else f + ".") or d == f.rstrip(".") for f in forbidden):
                bad.append(f"{m} imports {d}")
    assert not bad, "\n".join(sorted(bad))


#: Third-party packages a module may import inside a function: optional extras and
#: dependencies only some commands need.
OPTIONAL = ("asyncua", "paho", "prometheus_client", "cv2", "gi", "can", "canopen", "serial", "zmq", "msgpack",
            "urllib", "fcntl", "importlib", "resource", "webbrowser")


def _function_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    yield sub


def test_function_level_imports_are_optional_or_lazy_and_say_why():
    bad = []
    for name, path in MODULES.items():
        if not name.startswith(("cellcal.daemon", "cellcal.testing")):
            continue
        lines = path.read_text().splitlines()
        for node in _function_imports(ast.parse(path.read_text())):
            mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            mod = mod or ""
            ok = mod.startswith("cellcal.sim") or mod.split(".")[0] in OPTIONAL
            near = " ".join(lines[max(0, node.lineno - 3):node.lineno])
            if not ok or "#" not in near:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {mod}" + ("" if ok else " (not optional or lazy)"))
    assert not bad, "\n".join(bad)


def test_modules_stay_small():
    long = {str(p.relative_to(ROOT)): n for name, p in MODULES.items()
            if name.startswith(("cellcal.daemon", "cellcal.testing")) and (n := len(p.read_text().splitlines())) > 1000}
    assert not long, long
    service = len((ROOT / "daemon" / "service.py").read_text().splitlines())
    assert service <= 600, service


def test_run_kinds_live_in_one_package():
    from cellcal.daemon import protocol as P
    from cellcal.daemon import runs

    assert set(runs.names()) == set(P.RUN_KINDS)
    for name in runs.KINDS:  # the registry is lazy: a typo in it would otherwise wait for its first run
        assert runs.get(name).name == name.partition(":")[0]
    pattern = re.compile(r"\bKIND_[A-Z_]+\b")
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("cellcal.daemon") or name.startswith("cellcal.daemon.runs") or name in (
                "cellcal.daemon.protocol", "cellcal.daemon.wire.vocabulary"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if pattern.search(code):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def _any_in(node: ast.AST | None) -> bool:
    return node is not None and any((isinstance(n, ast.Name) and n.id == "Any") or (
        isinstance(n, ast.Attribute) and n.attr == "Any") or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                                                             and re.search(r"\bAny\b", n.value))
        for n in ast.walk(node))


def _daemon_trees() -> Iterator[tuple[Path, ast.Module, int]]:
    for name, path in MODULES.items():
        if name.startswith(("cellcal.daemon", "cellcal.testing")):
            text = path.read_text()
            yield path, ast.parse(text), len(text.splitlines())


def test_there_is_no_any_in_the_daemon():
    found = []
    for path, tree, _ in _daemon_trees():
        for x in ast.walk(tree):
            if (isinstance(x, ast.Name) and x.id == "Any") or (isinstance(x, ast.Attribute) and x.attr == "Any"):
                found.append(f"{path.relative_to(ROOT)}:{x.lineno}")
    assert not found, f"{len(found)} Any in the daemon:\n" + "\n".join(found)


def _public_functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level functions and methods of module-level classes whose names are public
    (``__init__`` counts: it is how a public class is called)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not m.name.startswith("_") or m.name == "__init__"):
                    yield m


def test_no_public_function_of_the_daemon_takes_or_returns_any():
    bad = []
    for path, tree, _ in _daemon_trees():
        for node in _public_functions(tree):
            a = node.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
                    *([a.kwarg] if a.kwarg else [])]
            if any(_any_in(x.annotation) for x in args) or _any_in(node.returns):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not bad, f"{len(bad)} public functions with Any:\n" + "\n".join(bad)
