"""Count the numpy calls one solver call makes (the linear bench's call-overhead figure).

A call counted is one entry into numpy from solver code: every ``np.<function>`` or ufunc
the ``cellcal.solver`` modules call (their module-level ``np`` is swapped for a counting
proxy while counting), and every ndarray method they call (``a.reshape``, ``a.max``, ...,
seen as C calls by ``sys.setprofile``). Calls numpy makes inside itself are not counted,
nor indexing and operators (``a[i]``, ``a @ b``), which are not numpy API calls by name.
"""

from __future__ import annotations

import collections
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np

#: Key the counts by the calling solver function too (``"np.matmul@_core.pivot_solve"``).
BY_CALLER = False


def _where(key: str, frame: Any = None) -> str:
    if not BY_CALLER:
        return key
    f = frame if frame is not None else sys._getframe(2)
    return f"{key}@{f.f_globals.get('__name__', '?').rsplit('.', 1)[-1]}.{f.f_code.co_name}"


class _Proxy:
    def __init__(self, mod: Any, counter: collections.Counter, state: list, prefix: str) -> None:
        self._mod, self._counter, self._state, self._prefix = mod, counter, state, prefix

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._mod, name)
        if isinstance(v, types.ModuleType):
            return _Proxy(v, self._counter, self._state, f"{self._prefix}{name}.")
        if isinstance(v, type) or not callable(v):
            return v
        return _Counted(v, self._counter, self._state, self._prefix + name)


class _Counted:
    """A numpy callable that counts its calls (and its methods', ``np.add.reduce``)."""

    def __init__(self, fn: Any, counter: collections.Counter, state: list, key: str) -> None:
        self._fn, self._counter, self._state, self._key = fn, counter, state, key

    def __call__(self, *a: Any, **k: Any) -> Any:
        state = self._state
        if state[0] == 0:
            self._counter[_where(self._key)] += 1
        state[0] += 1
        try:
            return self._fn(*a, **k)
        finally:
            state[0] -= 1

    def __getattr__(self, name: str) -> Any:
        v = getattr(self._fn, name)
        if callable(v):
            return _Counted(v, self._counter, self._state, f"{self._key}.{name}")
        return v


def count_numpy_calls(fn: Callable[[], Any]) -> collections.Counter:
    """Run ``fn()`` once and return how often each numpy entry point was called by solver code."""
    counter: collections.Counter = collections.Counter()
    state = [0]
    mods = [m for name, m in list(sys.modules.items())
            if name.startswith("cellcal.solver") and getattr(m, "np", None) is np]
    proxy = _Proxy(np, counter, state, "np.")

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and state[0] == 0 and isinstance(getattr(arg, "__self__", None), np.ndarray):
            counter[_where("ndarray." + arg.__name__, frame)] += 1

    for m in mods:
        m.np = proxy  # type: ignore[attr-defined]
    try:
        sys.setprofile(prof)
        fn()
    finally:
        sys.setprofile(None)
        for m in mods:
            m.np = np  # type: ignore[attr-defined]
    return counter
