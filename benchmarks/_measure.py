"""Peak-memory helpers shared by the benchmarks (Linux /proc; NaN where unavailable)."""

from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int | None:
    if not _STATUS.is_file():
        return None
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not permitted
        return False
    return True


def rss_mb() -> float:
    """Current resident set size in MB."""
    kb = _status_kb("VmRSS")
    return float("nan") if kb is None else kb * 1024 / 1e6


def peak_rss_mb() -> float:
    """Peak resident set size (since the last reset) in MB."""
    kb = _status_kb("VmHWM")
    return float("nan") if kb is None else kb * 1024 / 1e6
