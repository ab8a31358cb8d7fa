"""The figure helpers' contract: both formats with TrueType fonts, no partial file when a write
fails, the verdict matrix, a score across models and the heatmap grid."""
import re

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from audit import style
from audit.checks.base import MARKS
from audit.checks.randomization import heatmap_grid
from audit.sections import Figure, new_figure
from reports.figures import VERDICT_COLOURS, Renderer, render, save, save_all, score_figure, verdict_matrix


def test_save_writes_both_formats_atomically(tmp_path, monkeypatch):
    fig, ax = new_figure(2, 2)
    ax.plot([0, 1], [1, 0])
    png = save(Figure("curve", fig, "a curve"), tmp_path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "curve.png").read_bytes() == png
    assert (tmp_path / "curve.pdf").read_bytes()[:5] == b"%PDF-"
    old = (tmp_path / "curve.pdf").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        save(Figure("curve", fig, "a curve"), tmp_path)
    assert (tmp_path / "curve.pdf").read_bytes() == old  # the old file, never a truncated one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.pdf", "curve.png"]  # no .part left


def font_subtypes(pdf: bytes) -> set[str]:
    """The subtypes of the font dictionaries of a PDF (matplotlib writes them uncompressed)."""
    fonts = {"Type0", "Type1", "Type3", "TrueType", "CIDFontType0", "CIDFontType2", "MMType1"}
    return {s.decode() for s in re.findall(rb"/Subtype\s*/(\w+)", pdf)} & fonts


def verdict_frame() -> pd.DataFrame:
    """Three models' verdict rows as the verdict table holds them: each check's outcome and the mechanisms."""
    rows = []
    for model in ("a-sgd", "a-bort", "b-sgd"):
        for method, verdict, score, csc, logit, found in (
                ("gradient", "not rejected", 0.2, "not rejected", "not rejected", {}),
                ("lrp-zplus", "rejected: csc (chain converges)", 0.99, "rejected", "not rejected",
                 {"csc": ["rank-1 chain convergence"]}),
                ("deeplift", "inconclusive: random-logit", np.nan, "not rejected", "inconclusive", {})):
            rows.append({"model": model, "method": method, "role": "method", "random_logit_ssim": score,
                         "verdict": verdict, "outcome_csc": csc, "outcome_random-logit": logit, "mechanisms": found})
    return pd.DataFrame(rows[:-1])  # b-sgd has no deeplift row: n/a


def test_figures_saved_by_two_workers_are_the_bytes_one_process_writes(tmp_path):
    figures = []
    for k in range(5):
        fig, ax = new_figure(2, 1.5)
        ax.plot(np.arange(10) ** (k / 2), label=f"curve {k}")
        figures.append(Figure(f"f{k}", fig, f"figure {k}"))
    together = save_all(figures, tmp_path / "two", workers=2)
    alone = {f.name: save(f, tmp_path / "one") for f in figures}
    assert list(together) == [f.name for f in figures] and together == alone
    for f in figures:
        for suffix in (".png", ".pdf"):
            assert (tmp_path / "two" / f"{f.name}{suffix}").read_bytes() == (tmp_path / "one" / f"{f.name}{suffix}").read_bytes()
    assert save_all(figures[:1], tmp_path / "single") == {"f0": alone["f0"]}  # one figure: no worker started


class Unrenderable:
    def savefig(self, *args, **kwargs):
        raise ValueError("this figure cannot be saved")


def test_figures_rendered_while_the_next_are_drawn_are_the_bytes_one_process_renders():
    figures = []
    for k in range(5):
        fig, ax = new_figure(2, 1.5)
        ax.plot(np.arange(10) ** (k / 3), label=f"curve {k}")
        figures.append(Figure(f"f{k}", fig, f"figure {k}"))
    renderer = Renderer(workers=2)
    renderer.submit(figures[:2])  # a child renders these beside this process
    assert renderer.running
    renderer.submit(figures[2:4])
    renderer.submit(figures[4:])
    assert renderer.finish() == [render(f) for f in figures] and not renderer.running
    failing = Renderer(workers=2)
    failing.submit([Figure("bad", Unrenderable(), "a figure that cannot be rendered")])
    with pytest.raises(ValueError, match="cannot be saved"):  # the child's failure, raised here: rendered again
        failing.finish()
    failing.close()
    stopped = Renderer(workers=2)
    stopped.submit(figures)
    stopped.close()  # a build that fails before finish leaves no child behind
    assert not stopped.running


def test_saved_pdfs_embed_truetype_fonts_not_type3(tmp_path):
    fig = verdict_matrix(verdict_frame())
    save(fig, tmp_path)
    subtypes = font_subtypes((tmp_path / "verdict_matrix.pdf").read_bytes())
    assert subtypes and "Type3" not in subtypes and subtypes <= {"Type0", "CIDFontType2", "TrueType"}, subtypes
    with Image.open(tmp_path / "verdict_matrix.png") as png:
        width, _ = png.size
    assert abs(width - fig.figure.get_size_inches()[0] * style.PNG_DPI) <= 2  # 200 dpi, no cropping


def test_verdict_matrix_colours_each_cell_by_its_check_outcome_and_marks_the_mechanism():
    frame = verdict_frame()
    fig = verdict_matrix(frame)
    ax = fig.figure.axes[0]
    grid = ax.get_images()[0].get_array()
    states = list(VERDICT_COLOURS)
    columns = [t.get_text() for t in ax.get_xticklabels()]
    methods = [t.get_text() for t in ax.get_yticklabels()]
    assert methods == ["gradient", "lrp-zplus", "deeplift"] and grid.shape == (3, 6)
    assert columns == [f"{m}: {c}" for m in ("a-sgd", "a-bort", "b-sgd") for c in ("csc", "random-logit")]
    assert states[grid[0, columns.index("a-sgd: csc")]] == "not rejected"
    assert states[grid[1, columns.index("a-bort: csc")]] == "rejected"
    assert states[grid[2, columns.index("a-sgd: random-logit")]] == "inconclusive"
    assert states[grid[2, columns.index("b-sgd: random-logit")]] == "n/a"  # no row: not run
    marks = [t.get_text() for t in ax.texts]
    # gradient's two checks on three models, z+'s random logit on three, deeplift's CSC on two
    assert marks.count(MARKS["rejected"] + "C") == 3 and marks.count(MARKS["not rejected"]) == 6 + 3 + 2
    assert "pass" not in VERDICT_COLOURS


def test_score_figure_draws_each_method_in_its_colour_across_models():
    fig = score_figure(verdict_frame(), "random_logit_ssim")
    lines = {tuple(line.get_ydata()[:2]): line.get_color() for ax in fig.figure.axes for line in ax.get_lines()}
    assert lines[(0.2, 0.2)] == style.color("gradient") and lines[(0.99, 0.99)] == style.color("lrp-zplus")
    assert not any(ax.get_legend() for ax in fig.figure.axes) and fig.figure.legends


def test_heatmap_grid_shows_the_input_first_and_one_colour_bar_per_row():
    rng = np.random.default_rng(0)
    maps = {m: rng.normal(size=(3, 2, 8, 8)) * s for m, s in (("gradient", 1.0), ("lrp-zplus", 100.0))}
    images = rng.uniform(size=(2, 1, 8, 8))
    fig = heatmap_grid(maps, ["original", "fc", "conv"], "m", 1, "cascading", images=images, scale="row")
    assert "one symmetric colour scale per method row" in fig.caption
    shown = [ax for ax in fig.figure.axes if ax.get_images()]
    first = shown[0].get_images()[0].get_array()
    assert np.allclose(first, (images[1, 0] - images[1, 0].min()) / np.ptp(images[1, 0]))  # the input image
    rows = [ax for ax in shown[1:] if ax.get_images()[0].get_cmap().name.startswith("coolwarm")]
    assert len(rows) == 2
    for ax, method in zip(rows, ["gradient", "lrp-zplus"]):
        low, high = ax.get_images()[0].get_clim()
        assert low == -high and np.isclose(high, np.percentile(np.abs(maps[method][:, 1]), 99.5))
    bars = [ax for ax in fig.figure.axes if not ax.get_images()]
    assert len(bars) == 2 and len(fig.figure.axes) == 1 + 2 + 2  # input, a strip per row, a colour bar per row


def test_heatmap_grid_scales_each_map_on_its_own_by_default():
    # the last stage a thousand times smaller: on one row scale it would be blank, on its own it shows
    rng = np.random.default_rng(1)
    maps = {"gradient": rng.normal(size=(3, 1, 8, 8)) * np.array([1.0, 1.0, 1e-3])[:, None, None, None]}
    fig = heatmap_grid(maps, ["original", "fc", "conv"], "m", 0, "cascading")
    assert "each map on its own symmetric colour scale" in fig.caption
    (ax,) = [a for a in fig.figure.axes if a.get_images()]
    strip = np.ma.filled(ax.get_images()[0].get_array(), np.nan)
    assert ax.get_images()[0].get_clim() == (-1.0, 1.0)
    for c in range(3):
        stage = strip[:, c * (8 + 1): c * (8 + 1) + 8] if strip.shape[1] == 3 * 8 + 2 else None
        assert stage is not None
        expected = maps["gradient"][c, 0] / np.percentile(np.abs(maps["gradient"][c, 0]), 99.5)
        assert np.allclose(stage, expected)
    with pytest.raises(ValueError, match="scale must be one of"):
        heatmap_grid(maps, ["original", "fc", "conv"], "m", 0, "cascading", scale="column")


def test_heatmap_pages_keep_families_together_and_fit_a_page():
    from attributions.methods import BUILDERS
    from audit.checks.randomization import GRID_ROWS, grid_pages, heatmap_pages
    methods = list(BUILDERS)
    pages = grid_pages(methods)
    assert sorted(m for p in pages for m in p) == sorted(methods) and all(len(p) <= GRID_ROWS for p in pages)
    families = style.by_family(methods)
    for family, members in families.items():  # a family that fits a page is on one page
        if len(members) <= GRID_ROWS:
            assert sum(any(m in p for m in members) for p in pages) == 1, family
    maps = {m: np.random.default_rng(0).normal(size=(3, 2, 6, 6)) for m in ["gradient", "lrp-zplus", "edge"]}
    figures = heatmap_pages(maps, ["original", "fc", "conv"], "m", "cascading")
    assert [f.name for f in figures] == ["heatmaps_m_image0", "heatmaps_m_image1"]  # one page: no part suffix
    many = {m: maps["gradient"] for m in methods[:GRID_ROWS + 1]}  # one more than a page holds
    split = heatmap_pages(many, ["original", "fc", "conv"], "m", "cascading")
    assert [f.name for f in split[:2]] == ["heatmaps_m_image0_part1", "heatmaps_m_image0_part2"]
    assert "part 1 of 2" in split[0].caption and len(split) == 4


def test_csc_figure_marks_the_collapse_threshold():
    from audit.checks.convergence import csc_figure
    rows = [{"model": "m", "method": "lrp-zplus", "inject_at": "logits", "is_logits": True, "depth": d,
             "median": 0.9, "p25": 0.8, "p75": 0.95, "baseline": 0.1} for d in range(3)]
    figure = csc_figure(pd.DataFrame(rows), threshold=0.99)
    lines = [line for ax in figure.figure.axes for line in ax.get_lines()]
    assert any(np.allclose(line.get_ydata(), 1 - 0.99) for line in lines)
    assert "0.99" in figure.caption
