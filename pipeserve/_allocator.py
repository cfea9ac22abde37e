"""Keep the C allocator from returning large freed buffers to the kernel between requests.

A request's tensors, bodies and messages are hundreds of kilobytes each (an image is 150 KB as uint8 pixels,
600 KB as float32). glibc serves blocks that large with ``mmap`` and unmaps them when freed, or trims the top of
its heap when freed memory there exceeds a threshold, so the next request faults the same pages back in: on the
imagenet inference server over gRPC, page faults were a quarter of the CPU time that was not the model's (perf,
docs/benchmarks/split.md). Raising both thresholds keeps such buffers in the heap for reuse; the resident size
stays what the busiest moment needed (measured: no change at concurrency 32, 66 MB).

Only glibc reads these settings; elsewhere ``tune_allocator`` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks below this come from the heap, not from their own mmap (glibc's largest allowed value on 64-bit).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Free memory at the top of the heap kept for reuse instead of being trimmed.
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def tune_allocator() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (and the processes it forks). True if applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        logger.debug("Not glibc: the allocator keeps its defaults")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    logger.debug("glibc allocator thresholds %s", "raised" if applied else "left as they were (mallopt refused)")
    return applied
