"""Small multiples: one panel per family, legends outside every axes."""
import numpy as np

from audit import style
from audit.panels import family_panels, method_boxes, method_legend
from tests.helpers import legend_outside_axes

METHODS = ["gradient", "lrp-zplus", "deeplift", "lrp-epsilon", "edge", "smoothgrad"]


def test_one_panel_per_family_and_row_and_the_legend_below():
    with style.styled():
        fig, axes, groups = family_panels(METHODS, rows=["model-a", "model-b"])
        assert axes.shape == (2, 5) and list(groups) == ["gradient-based", "DeepLIFT", "LRP z+ family", "other LRP",
                                                         "controls"]
        for ax, methods in zip(axes[0], groups.values()):
            for m in methods:
                ax.plot([0, 1], [0, 1], color=style.color(m))
        method_legend(fig, groups)
        assert legend_outside_axes(fig)
        labels = [t.get_text() for t in fig.legends[0].get_texts() if t.get_text()]
        assert sorted(labels) == sorted(METHODS)


def test_a_legend_inside_the_axes_is_detected():
    fig, axes, groups = family_panels(METHODS)
    axes[0, 0].plot([0, 1], label="x")
    axes[0, 0].legend()
    assert not legend_outside_axes(fig)


def test_boxes_draw_every_image_and_skip_empty_methods():
    fig, axes, groups = family_panels(["gradient", "smoothgrad"], sharex=False)
    values = {"gradient": np.array([0.1, 0.2, np.nan, 0.4]), "smoothgrad": np.array([np.nan])}
    method_boxes(axes[0, 0], ["gradient", "smoothgrad"], values)
    points = [c for c in axes[0, 0].collections if c.get_offsets().shape[0]]
    assert sum(c.get_offsets().shape[0] for c in points) == 3  # the finite values, as points
    assert [t.get_text() for t in axes[0, 0].get_xticklabels()] == ["gradient", "smoothgrad"]


def test_the_random_controls_median_is_the_floor_drawn_in_every_panel():
    """Where the random map ran, its median (0.1 of 0.0, 0.1, 0.2) is a dotted line in every family's panel; without
    it, none is drawn."""
    import pandas as pd

    from audit.panels import floor_of, score_boxes

    rows = [{"method": m, "image": i, "ssim": v} for m, values in (("gradient", (0.3, 0.5, 0.4)),
                                                                    ("lrp-zplus", (0.9, 0.95, 0.99)),
                                                                    ("random", (0.0, 0.1, 0.2)))
            for i, v in enumerate(values)]
    part = pd.DataFrame(rows)
    assert floor_of(part, "ssim").tolist() == [0.1] and floor_of(part[part.method != "random"], "ssim") is None
    fig = score_boxes(part, "ssim", 0.8, "SSIM")
    for ax in fig.axes[:3]:
        dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert len(dotted) == 1 and dotted[0].get_ydata()[0] == 0.1
    fig = score_boxes(part[part.method != "random"], "ssim", 0.8, "SSIM")
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_linestyle() == ":"]
