"""Progress as a person reads it: bars redrawn on a terminal, plain lines in a file or a CI log.

tqdm redraws its bars with carriage returns and cursor movements (``ESC[A``) that a log file keeps verbatim, around
the lines that matter. A bar is drawn only where it can be redrawn: progress asked for, and the stream tqdm draws
on (stderr) a terminal. Everywhere else the long steps write what they already write in any case, one plain line
per unit: a run's units (and its sequential looks), a training's epochs, a report's stages, a download's files.
``--quiet`` (``progress=False``) leaves the bars out too; the lines stay.
"""
from __future__ import annotations

import sys


def bars(progress: bool) -> bool:
    """Whether to draw progress bars: ``progress`` asked for them and stderr is a terminal."""
    stream = sys.stderr
    return progress and stream is not None and hasattr(stream, "isatty") and stream.isatty()
