"""The report's look in one place: matplotlib settings, paper sizes, and each method's colour.

Methods are drawn in their family (:data:`attributions.catalog.FAMILIES`); each family has one hue
of the Okabe-Ito palette (distinguishable with every common colour-vision deficiency) and its
methods are shades of that hue, from dark to light in registry order. A method's colour depends
only on its name, so it is the same in every figure of every report.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib as mpl
from matplotlib.colors import to_hex, to_rgb

# the families are the catalog's (no torch): style.family, style.members and style.by_family are its
from attributions.catalog import FAMILIES as FAMILIES
from attributions.catalog import by_family as by_family
from attributions.catalog import family as family
from attributions.catalog import members as members

ONE_COLUMN = 3.3  # inches: the text width of one column of a two-column paper
TWO_COLUMN = 6.9  # inches: the full text width of a two-column paper
PNG_DPI = 200

# Okabe & Ito 2008: blue, reddish purple, vermillion, bluish green, orange, sky blue; grey for the controls.
FAMILY_HUES = {"gradient-based": "#0072B2", "DeepLIFT": "#CC79A7", "LRP z+ family": "#D55E00",
               "other LRP": "#009E73", "class activation maps": "#E69F00", "attention": "#56B4E9",
               "controls": "#6E6E6E"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (5, 3, 1, 3)),
                               (0, (8, 2)), (0, (2, 1, 2, 4)))

RC: dict[str, Any] = {
    "font.size": 7, "axes.titlesize": 7, "axes.labelsize": 7, "xtick.labelsize": 6, "ytick.labelsize": 6,
    "legend.fontsize": 6, "figure.titlesize": 8, "lines.linewidth": 1.0, "lines.markersize": 3,
    "axes.linewidth": 0.6, "axes.spines.top": False, "axes.spines.right": False, "legend.frameon": False,
    "pdf.fonttype": 42, "ps.fonttype": 42,  # TrueType (Type 42) fonts: journals reject Type 3
    "savefig.dpi": PNG_DPI, "figure.dpi": 100, "image.interpolation": "nearest",
}


@contextmanager
def styled() -> Iterator[None]:
    """Within the block, figures are made and saved with the report's settings (:data:`RC`)."""
    with mpl.rc_context(RC):  # type: ignore[arg-type]  # matplotlib types the keys as literals
        yield


def _shade(hue: str, position: float) -> str:
    """``hue`` darkened (position < 0) or lightened (> 0) toward black / white by ``|position|``."""
    r, g, b = to_rgb(hue)
    target = 1.0 if position > 0 else 0.0
    return to_hex((r + abs(position) * (target - r), g + abs(position) * (target - g), b + abs(position) * (target - b)))


def color(method: str) -> str:
    """The method's colour: its family's hue, shaded by its place in the family."""
    group = members(family(method))
    index = group.index(method) if method in group else 0
    # dark to light, spread over -0.4 .. +0.35 so that the lightest still reads on white
    position = -0.4 + 0.75 * index / (len(group) - 1) if len(group) > 1 else 0.0
    return _shade(FAMILY_HUES[family(method)], position)


def marker(method: str) -> str:
    """The method's marker: its place in the family, so that shades of one hue also differ in shape."""
    group = members(family(method))
    return MARKERS[(group.index(method) if method in group else 0) % len(MARKERS)]


def linestyle(method: str) -> Any:
    """The method's line style, by its place in the family (as :func:`marker`)."""
    group = members(family(method))
    return LINESTYLES[(group.index(method) if method in group else 0) % len(LINESTYLES)]


