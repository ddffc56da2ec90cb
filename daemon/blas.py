"""One BLAS thread for cellcal's processes (ADR 0033).

The solver's matrices are small (12 x 12 normal matrices, (N, 6, 6) stacks, a camera chain's
(n, 21) Jacobian): a BLAS thread pool buys nothing at these sizes, and on a machine whose
cores are busy with other work its threads wait for each other at every product. Measured
here with three CPU-bound jobs beside it (bench/RESULTS.md, ADR 0033): one camera hand-eye
solve took 2.1 s of CPU with OpenBLAS's default two threads and 0.42 s with one.

OpenBLAS reads ``OPENBLAS_NUM_THREADS`` once, when numpy loads it, so
:func:`prefer_one_blas_thread` runs before anything imports numpy (the ``cellcal`` command's
first step); a value the user set is kept. :func:`limit_loaded_blas` does the same for a
process in which numpy is already loaded (a test runner), through the bundled OpenBLAS's own
call. Nothing here imports numpy itself.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import MutableMapping

#: The variables the BLAS builds numpy ships with read for their thread count.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def prefer_one_blas_thread(environ: MutableMapping[str, str] | None = None) -> None:
    """Set each of :data:`BLAS_THREAD_VARIABLES` to ``"1"`` unless it is set already.

    Child processes (the simulator, a daemon started by ``cellcal demo``) inherit it.
    """
    env = os.environ if environ is None else environ
    for name in BLAS_THREAD_VARIABLES:
        env.setdefault(name, "1")


def limit_loaded_blas(threads: int = 1) -> int | None:
    """Set the thread count of the OpenBLAS numpy has loaded; its count before, or ``None``
    when numpy is not loaded or its BLAS is not the bundled OpenBLAS (then nothing changes)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads!r}")
    numpy = sys.modules.get("numpy")
    where = getattr(numpy, "__file__", None)
    if not isinstance(where, str):
        return None
    libs = os.path.join(os.path.dirname(os.path.dirname(where)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "libscipy_openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: this returns the same library
            get, put = lib.scipy_openblas_get_num_threads64_, lib.scipy_openblas_set_num_threads64_
        except (OSError, AttributeError):
            continue
        get.restype = ctypes.c_int
        put.argtypes = [ctypes.c_int]
        before = int(get())
        put(threads)
        return before
    return None
