"""The random-logit test: class sensitivity of the maps, and the random classes it draws."""
import pytest
import torch

from audit import random_logit_test
from audit.checks.random_logit import random_classes


def test_random_logit_separates_converging_methods_from_the_gradient(trained):
    model, x, y = trained
    df = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                           progress=False)
    assert list(df.columns) == ["method", "image", "true_class", "random_class", "ssim", "spearman", "spearman_abs"]
    assert (df.random_class != df.true_class).all()
    med = df.groupby("method").ssim.median()
    assert med["lrp-zplus"] > med["gradient"] and med["deeplift-ablation"] > med["gradient"]
    assert med["edge"] == pytest.approx(1.0)
    again = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                              progress=False)
    assert df.equals(again)


def test_random_classes_differ_from_labels_and_cover_the_rest():
    y = torch.zeros(5000, dtype=torch.long)
    r = random_classes(y, 10, seed=3)
    assert (r != 0).all() and set(r.tolist()) == set(range(1, 10))

