"""glibc's allocator told to keep the heap it has grown (`keep_heap`).

A training step or a decode step frees and allocates the same few megabytes of activations
again and again. Under glibc's defaults a freed block above a moving threshold goes back to
the kernel (munmap, or a heap trimmed at its top), and the next step faults it in again page
by page: about a thousand minor faults per update of the default model. Fixed thresholds
keep those pages in the process; blocks of 32 MiB and more (a large model's weights) are
still mapped and unmapped on their own. Numbers do not change, only where memory comes from.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt parameters (glibc's malloc.h) and the values set.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
KEEP_HEAP = {
    M_MMAP_THRESHOLD: 32 << 20,  # blocks from here up are mapped on their own
    M_TRIM_THRESHOLD: 64 << 20,  # free memory kept at the heap's top before it shrinks
    M_TOP_PAD: 16 << 20,  # extra the heap grows by, so growth is rare
}


def keep_heap() -> bool:
    """Set glibc's thresholds for this process; False where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in KEEP_HEAP.items())
