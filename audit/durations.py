"""Durations as a reader says them, for the progress lines of runs and training."""
from __future__ import annotations


def duration(seconds: float) -> str:
    """``seconds`` as a reader says it: "45 s", "3 min 05 s", "1 h 02 min", or "unknown" (NaN)."""
    if seconds != seconds:
        return "unknown"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
