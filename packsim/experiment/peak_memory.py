"""Peak resident memory of one call: how much this process's RSS rose while ``fn()`` ran.

``peak_rise_mib(fn)`` resets Linux's peak mark (``/proc/self/clear_refs``), runs ``fn()`` once and
returns ``VmHWM - VmRSS before`` in MiB, or ``None`` where ``/proc`` is not available (not Linux).
To make that rise honest, :func:`track_freed_memory` first asks glibc to hand every block over
64 KiB back to the operating system as soon as it is freed (``mallopt(M_MMAP_THRESHOLD)``), and
each measurement starts with ``malloc_trim(0)``; otherwise freed memory stays in the process for
reuse and a path could look free. CPU tensors only (a GPU has ``torch.cuda.max_memory_allocated``).

Lessons: A7.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_M_MMAP_THRESHOLD = -3
_libc = None


def track_freed_memory(threshold_bytes: int = 64 * 1024) -> bool:
    """Ask glibc to return freed blocks over ``threshold_bytes`` to the OS at once. False if not glibc."""
    global _libc
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, threshold_bytes)
    except (OSError, AttributeError):
        return False
    _libc = libc
    return True


def rss_mib(field: str = "VmRSS") -> float | None:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process in MiB; None off Linux."""
    try:
        line = next(x for x in _STATUS.read_text().splitlines() if x.startswith(field + ":"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) / 1024


def peak_rise_mib(fn: Callable[[], object]) -> float | None:
    """Run ``fn()`` once; the rise of resident memory during the call in MiB (None if unmeasurable)."""
    if _libc is None:
        track_freed_memory()
    if _libc is not None:
        _libc.malloc_trim(0)  # give memory freed earlier back to the OS first
    try:
        _CLEAR_REFS.write_text("5")  # reset the peak mark (VmHWM) to the current RSS
    except OSError:
        fn()
        return None
    before = rss_mib("VmRSS")
    fn()
    peak = rss_mib("VmHWM")
    return None if before is None or peak is None else max(peak - before, 0.0)


__all__ = ["peak_rise_mib", "rss_mib", "track_freed_memory"]
