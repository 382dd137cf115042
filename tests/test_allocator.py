"""rlcore/allocator.py: a process that keeps its heap does not fault freed memory back in."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from rlcore.allocator import keep_heap

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Two 10 MiB blocks allocated, written and freed, ten times: the minor page faults per time.
CYCLES = """
import resource, sys
if sys.argv[1] == "keep":
    from rlcore.allocator import keep_heap
    assert keep_heap()
def cycle():
    a = bytearray(10 << 20); b = bytearray(10 << 20); del b; del a
cycle(); cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10)
"""


def faults_per_cycle(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True,
                         check=True)
    return float(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_a_kept_heap_reuses_freed_pages():
    # glibc's defaults hand the 20 MiB back at each free (about 5,000 pages faulted in again)
    kept, default = faults_per_cycle("keep"), faults_per_cycle("default")
    assert kept < 100
    assert kept * 10 < default


@pytest.mark.skipif(GLIBC, reason="off glibc there is nothing to set")
def test_elsewhere_nothing_is_set():
    assert keep_heap() is False
