"""The allocation probe both allocation tests use (solver linear path, refined path)."""

import tracemalloc


def peak_bytes(fn) -> int:
    """Peak traced memory one call of ``fn`` allocates beyond what was live before it.

    Two warm-up calls first (imports, caches); numpy reports its data buffers to
    tracemalloc, so this bounds what a solve allocates.
    """
    fn()
    fn()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base
