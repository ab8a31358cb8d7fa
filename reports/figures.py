"""Saving the report's figures (PDF and PNG), and the figures that span checks: baseline vs Bort,
the verdict matrix and one score across models."""
from __future__ import annotations

import io
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure as MplFigure
from matplotlib.patches import Patch

from audit import style
from audit.atomic import atomic_write_bytes
from audit.checks.base import INCONCLUSIVE, MARKS, NOT_REJECTED, REJECTED
from audit.panels import family_panels, method_legend
from audit.sections import Figure
from reports.answer import LEGEND, matrix_outcomes, matrix_table
from reports.tables import heading

# rejected / not rejected / inconclusive / not run: Okabe-Ito orange and blue, grey, white; a mark in each cell
# says the same for grey-scale prints (no tick: a sanity check never certifies a method)
VERDICT_COLOURS = {REJECTED: "#E69F00", NOT_REJECTED: "#0072B2", INCONCLUSIVE: "#BBBBBB", "n/a": "#FFFFFF"}


def render(figure: Figure) -> tuple[bytes, bytes]:
    """``figure`` as PDF (TrueType fonts, no creation date: the same results give byte-identical files) and as PNG
    (200 dpi) bytes."""
    with style.styled():  # the font type and resolution are read when saving
        pdf, png = io.BytesIO(), io.BytesIO()
        figure.figure.savefig(pdf, format="pdf", metadata={"CreationDate": None})
        figure.figure.savefig(png, format="png", dpi=style.PNG_DPI)
    return pdf.getvalue(), png.getvalue()


def save(figure: Figure, directory: Path) -> bytes:
    """Write ``figures/<name>.pdf`` (TrueType fonts) and ``.png`` (200 dpi); returns the PNG bytes."""
    return _write(figure.name, render(figure), directory)


def _write(name: str, rendered: tuple[bytes, bytes], directory: Path) -> bytes:
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / f"{name}.pdf", rendered[0])
    atomic_write_bytes(directory / f"{name}.png", rendered[1])
    return rendered[1]


_PENDING: list[Figure] = []  # what a Renderer's forked children render: inherited, never pickled


def _render_some(indices: list[int], send: Connection) -> None:
    """A child's work: render the pending figures at ``indices`` and send their bytes (None where one fails: the
    parent renders it again and raises its error)."""
    try:
        out: list[tuple[bytes, bytes] | None] = [render(_PENDING[i]) for i in indices]
    except Exception:
        out = [None] * len(indices)
    send.send(out)
    send.close()


class Renderer:
    """Renders figures while this process goes on drawing the next ones: rendering is single-threaded, so a forked
    child renders the figures given so far (:meth:`submit`) beside this process, and :meth:`finish` shares what is
    left between this process and ``workers`` - 1 more children (default: 2 shares, the cores there are). Forked,
    the children inherit the figures instead of pickling them, and render the bytes one process would. Serial where
    processes cannot fork or one worker is asked for."""

    def __init__(self, workers: int | None = None) -> None:
        import multiprocessing
        import os

        self.workers = min(workers or 2, os.cpu_count() or 1)
        self.fork = self.workers > 1 and "fork" in multiprocessing.get_all_start_methods()
        self.figures: list[Figure] = []
        self.rendered: dict[int, tuple[bytes, bytes] | None] = {}
        self.running: list[tuple[list[int], Connection, BaseProcess]] = []
        self.given = 0  # the figures before this index are rendered or being rendered

    def add(self, figures: list[Figure]) -> None:
        """Queue ``figures`` to be rendered by :meth:`finish`."""
        self.figures += figures

    def submit(self, figures: list[Figure]) -> None:
        """Queue ``figures``; while no child is rendering, start one on every figure queued and not yet given."""
        self.add(figures)
        self._collect(wait=False)
        if self.fork and not self.running and self.given < len(self.figures):
            self._start(list(range(self.given, len(self.figures))))
            self.given = len(self.figures)

    def finish(self) -> list[tuple[bytes, bytes]]:
        """Every queued figure's (PDF, PNG) bytes (:func:`render`), in the order queued."""
        rest = list(range(self.given, len(self.figures)))
        self.given = len(self.figures)
        # a child still rendering an earlier share takes a core too: the shares balance out over the three
        shares = self.workers if self.fork else 1
        for k in range(1, min(shares, len(rest))):  # every shares-th figure from the k-th: each a like mix
            self._start(rest[k::shares])
        for i in rest[::shares]:  # this process's share, beside the children
            self.rendered[i] = render(self.figures[i])
        self._collect(wait=True)
        _PENDING.clear()
        out = []
        for i, figure in enumerate(self.figures):
            done = self.rendered.get(i)
            out.append(done if done is not None else render(figure))  # a child that failed: its error raised here
        return out

    def save(self, directory: Path) -> dict[str, bytes]:
        """Write every queued figure's ``figures/<name>.pdf`` and ``.png`` into ``directory`` (:meth:`finish`'s bytes;
        this process writes every file, in order, as a serial :func:`save` does); returns {name: PNG bytes}."""
        return {f.name: _write(f.name, r, directory) for f, r in zip(self.figures, self.finish())}

    def close(self) -> None:
        """Stop the children still rendering (a build that failed before :meth:`finish`)."""
        for _, receive, child in self.running:
            child.kill()
            child.join()
            receive.close()
        self.running.clear()
        _PENDING.clear()

    def _start(self, indices: list[int]) -> None:
        import multiprocessing

        _PENDING[:] = self.figures
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_render_some, args=(indices, send), daemon=True)
        child.start()
        send.close()
        self.running.append((indices, receive, child))

    def _collect(self, wait: bool) -> None:
        """Take the bytes of the children that have sent theirs (``wait``: of every child, waiting for them)."""
        for job in list(self.running):
            indices, receive, child = job
            if not wait and not receive.poll():
                continue
            try:
                self.rendered.update(zip(indices, receive.recv()))
            except EOFError:  # the child died without a word: this process renders its figures
                pass
            receive.close()
            child.join()
            self.running.remove(job)


def save_all(figures: list[Figure], directory: Path, workers: int | None = None) -> dict[str, bytes]:
    """:func:`save` every figure, rendered by a :class:`Renderer` of ``workers`` processes; returns {name: PNG bytes}
    in the order given."""
    renderer = Renderer(workers)
    renderer.add(figures)
    return renderer.save(directory)


def bort_figure(comparison: pd.DataFrame) -> Figure | None:
    """Median scores of the first baseline / Bort pair per method, side by side (baseline light,
    Bort solid, each in the method's colour)."""
    if comparison.empty:
        return None
    part = comparison[comparison.test == "random-logit"]
    if part.empty:
        part = comparison
    pair = part[["baseline", "bort"]].drop_duplicates().iloc[0]
    part = part[(part.baseline == pair.baseline) & (part.bort == pair.bort)]
    methods = [m for group in style.by_family(list(part.method)).values() for m in group]
    part = part.set_index("method").loc[methods]
    y = np.arange(len(methods))
    fig = MplFigure(figsize=(style.ONE_COLUMN, 0.16 * len(methods) + 0.9), layout="constrained")
    ax = fig.subplots()
    colours = [style.color(m) for m in methods]
    ax.barh(y - 0.2, part.baseline_score, height=0.38, color=colours, alpha=0.4)
    ax.barh(y + 0.2, part.bort_score, height=0.38, color=colours)
    ax.set_yticks(y, methods)
    for label, colour in zip(ax.get_yticklabels(), colours):
        label.set_color(colour)
    ax.invert_yaxis()
    test, score, better = str(part.test.iloc[0]), str(part.score.iloc[0]), str(part.better.iloc[0])
    ax.set_xlabel(f"median {score} ({test}; {better} is better)")
    fig.legend(handles=[Patch(color="0.55", alpha=0.4, label=str(pair.baseline)), Patch(color="0.2", label=str(pair.bort))],
               loc="outside lower center", ncols=2)
    return Figure(f"bort_vs_{pair.baseline}", fig, f"Median {score} ({test}, {better} is better) per method of "
                  f"{pair.baseline} (light) and its Bort-trained twin {pair.bort} (solid).")


def verdict_matrix(verdict: pd.DataFrame) -> Figure:
    """Methods (rows, the controls last) x each model's checks (columns): rejected, not rejected or inconclusive by
    colour and mark, a rejection's mechanisms by letter (:func:`reports.answer.matrix_table`, read from the
    verdict table's outcome and mechanism data)."""
    matrix, outcomes = matrix_table(verdict), matrix_outcomes(verdict)
    columns = list(matrix.columns[1:])
    states = list(VERDICT_COLOURS)
    grid = np.array([[states.index(o or "n/a") for o in row] for row in outcomes[columns].to_numpy()],
                    dtype=int).reshape(len(matrix), len(columns))
    fig = MplFigure(figsize=(min(style.TWO_COLUMN, 0.32 * len(columns) + 1.6), 0.2 * len(matrix) + 1.9),
                    layout="constrained")
    ax = fig.subplots()
    ax.imshow(grid, cmap=ListedColormap(list(VERDICT_COLOURS.values())), vmin=-0.5, vmax=len(states) - 0.5,
              aspect="auto")
    for (r, c), cell in np.ndenumerate(matrix[columns].to_numpy()):
        ax.text(c, r, cell, ha="center", va="center", fontsize=6,
                color="white" if states[grid[r, c]] == "not rejected" else "black")
    ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", rotation_mode="anchor")
    methods = list(matrix.method)
    ax.set_yticks(range(len(methods)), methods)
    for label, method in zip(ax.get_yticklabels(), methods):
        label.set_color(style.color(method))
    ax.set_xticks(np.arange(len(columns) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(methods) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.legend(handles=[Patch(facecolor=VERDICT_COLOURS[s], edgecolor="0.6", label=f"{MARKS[s]} {s}")
                        for s in states if s != "n/a"], loc="outside lower center", ncols=3)
    return Figure("verdict_matrix", fig, "Verdict matrix: each check's outcome per method (rows; the controls, "
                  "which must come out as their checks say, last) and model (columns). " + LEGEND[0].upper()
                  + LEGEND[1:] + ".")


def score_figure(verdict: pd.DataFrame, column: str) -> Figure:
    """The verdict table's ``column`` (a check's median score) across models, one panel per family."""
    models = list(dict.fromkeys(verdict.model))
    fig, axes, groups = family_panels(list(verdict.method), panel_height=2.0)
    x = np.arange(len(models))
    for ax, methods in zip(axes[0], groups.values()):
        for method in methods:
            rows = verdict[verdict.method == method].set_index("model").reindex(models)
            ax.plot(x, rows[column].astype(float), color=style.color(method), marker=style.marker(method),
                    linestyle=style.linestyle(method))
        ax.set_xticks(x, models, rotation=60, ha="right", rotation_mode="anchor")
    axes[0, 0].set_ylabel(heading(column))
    method_legend(fig, groups)
    return Figure(f"score_{column}", fig, f"{heading(column)} (the verdict's score) per model and method, one panel "
                  "per method family.")
