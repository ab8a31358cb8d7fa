"""The README's figure: cascading randomization of the shipped cnn-sgd, one image, the gradient against guided
backprop and LRP-z+.

Regenerate with ``.venv/bin/python docs/readme_figure.py`` (seconds); it writes ``docs/figures/randomization.png``
and prints the median SSIM to the trained maps at each stage over the 16 images it scores.
"""
from __future__ import annotations

from pathlib import Path

import torch

from audit import embedded_sample, load_checkpoint, randomization_with_maps
from audit.checks.randomization import heatmap_grid
from audit.style import styled

METHODS = ["gradient", "guided-backprop", "lrp-zplus"]
OUT = Path(__file__).resolve().parent / "figures" / "randomization.png"


def main() -> None:
    model = load_checkpoint("cnn-sgd")
    x, y = embedded_sample()
    x, y = torch.from_numpy(x[:16]), torch.from_numpy(y[:16])
    table, maps = randomization_with_maps(model, x, y, METHODS, order="cascading", keep_maps=1, progress=False)
    stages = table.drop_duplicates("stage").sort_values("stage").layer.tolist()
    print(table.groupby(["method", "stage"]).ssim.median().unstack().round(2).to_string())
    with styled():
        figure = heatmap_grid(maps, stages, "cnn-sgd", 0, "cascading", images=x[:1].numpy())
        OUT.parent.mkdir(exist_ok=True)
        figure.figure.savefig(OUT, dpi=110, bbox_inches="tight")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
