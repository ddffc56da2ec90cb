"""One BLAS thread for cellcal's processes (ADR 0033): the command sets it before numpy
loads, keeps a value the user chose, and a loaded OpenBLAS can be limited in place."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cellcal.daemon.blas import BLAS_THREAD_VARIABLES, limit_loaded_blas, prefer_one_blas_thread

# A child that runs the cellcal command's entry point on `--help` of no command, then reports
# whether numpy had been imported before main() ran and what the environment says after.
_CHILD = """
import os, sys
import cellcal.daemon.cli as cli
loaded_before = 'numpy' in sys.modules
try:
    cli.main(['--help'])
except SystemExit:
    pass
print(loaded_before, os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('MKL_NUM_THREADS'))
"""


def _child(env_extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return out.strip().splitlines()[-1].split()


def test_the_command_asks_for_one_thread_before_numpy_loads():
    loaded_before, openblas, mkl = _child({})
    assert loaded_before == "False"  # so OpenBLAS will read the variable when it loads
    assert (openblas, mkl) == ("1", "1")


def test_a_thread_count_the_user_set_is_kept():
    _, openblas, mkl = _child({"OPENBLAS_NUM_THREADS": "2"})
    assert (openblas, mkl) == ("2", "1")


def test_prefer_sets_only_what_is_unset():
    env = {"MKL_NUM_THREADS": "4"}
    prefer_one_blas_thread(env)
    assert env == {"MKL_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "1"}


def test_a_loaded_openblas_is_limited_in_place():
    import numpy as np

    if "openblas" not in str(np.show_config(mode="dicts")).lower():
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    before = limit_loaded_blas(2)
    assert before is not None
    assert limit_loaded_blas(1) == 2  # the count set by the call before
    assert limit_loaded_blas(before) == 1
    with pytest.raises(ValueError, match="threads"):
        limit_loaded_blas(0)
