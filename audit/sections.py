"""The report's section model: what a check (or the report itself) contributes to a report.

A section is plain data (a title, text, tables, figures) built once; :mod:`reports` renders the
same sections to HTML, Markdown and LaTeX. Figures are matplotlib ``Figure`` objects made without
pyplot, so building a section never touches a global plotting state or a display.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure as MplFigure


class RunSettings(Protocol):
    """What a check's report reads of the run's configuration (:class:`audit.run.config.AuditConfig` is one;
    named here, since the configuration imports the checks, which import this module)."""

    @property
    def preprocess(self) -> str | dict[str, Any]: ...


@dataclass
class Table:
    """A table of a section: ``frame`` with a ``caption``; ``label`` keys it in LaTeX (``tab:<label>``);
    ``printed``: whether the PDF shows it (the HTML, the Markdown and ``tables.tex`` hold every table)."""

    frame: pd.DataFrame
    caption: str
    label: str
    printed: bool = True


@dataclass
class Figure:
    """A figure of a section: saved as ``figures/<name>.png`` and ``.pdf``; ``printed``: whether the PDF shows it
    (one of many examples need not be; the HTML and Markdown show every figure)."""

    name: str
    figure: MplFigure
    caption: str
    printed: bool = True


def print_first(figures: list[Figure], n: int = 1) -> list[Figure]:
    """``figures`` with only the first ``n`` printed: a gallery of examples (one grid per image and model) whose
    print shows its first and names the rest."""
    return [f if k < n else dataclasses.replace(f, printed=False) for k, f in enumerate(figures)]


@dataclass
class Section:
    """A titled part of the report: a paragraph, figures, tables, and a preformatted block (``code``);
    ``appendix``: details looked up rather than read (after the main part; collapsed in HTML)."""

    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    code: str = ""
    appendix: bool = False


@dataclass
class ReportContext:
    """What a check may read when it builds its sections besides its own table.

    ``config``: the run's configuration; ``examples(model, test, methods)``: the example heatmaps
    the run kept, {method: (stages, images, H, W)}, and the inputs they explain, (images, C, H, W)
    or None; ``run``: the run folder.
    """

    config: RunSettings
    run: Path
    examples: Callable[[str, str, list[Any]], tuple[dict[str, np.ndarray], np.ndarray | None]]

    def manifest(self) -> dict[str, Any]:
        """The run's ``manifest.json`` (its twins, skipped models, ...); {} where the folder has none."""
        path = self.run / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}


def new_figure(width: float, height: float) -> tuple[MplFigure, Axes]:
    """A pyplot-free figure of ``width`` x ``height`` inches and its one axes."""
    fig = MplFigure(figsize=(width, height))
    axes: Axes = fig.subplots()  # one axes, not an array
    return fig, axes
