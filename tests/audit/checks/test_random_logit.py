"""The random-logit test: class sensitivity of the maps, and the random classes it draws."""
import copy

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from skimage.metrics import structural_similarity

from attributions import Explainer
from audit import parameter_randomization, random_logit_test
from audit.checks.random_logit import random_classes
from audit.errors import AuditError
from audit.measures.heatmaps import heatmaps
from audit.measures.similarity import normalize_map


def test_random_logit_separates_converging_methods_from_the_gradient(trained):
    model, x, y = trained
    df = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                           progress=False)
    assert list(df.columns) == ["method", "image", "true_class", "random_class", "ssim", "spearman", "spearman_abs",
                                "input_spearman_abs", "edge_spearman_abs"]
    assert (df.random_class != df.true_class).all()
    med = df.groupby("method").ssim.median()
    assert med["lrp-zplus"] > med["gradient"] and med["deeplift-ablation"] > med["gradient"]
    assert med["edge"] == pytest.approx(1.0)
    again = random_logit_test(model, x, y, ["gradient", "lrp-zplus", "deeplift-ablation", "edge"], seed=0,
                              progress=False)
    assert df.equals(again)


@pytest.mark.parametrize("method", ["gradient", "lrp-epsilon"])  # maps of one sign, maps of both signs
def test_scores_are_scipys_spearman_and_scikit_images_ssim_of_the_two_maps(trained, method):
    """Each row from the two maps by the definitions: Spearman (scipy) of the signed maps (the channel sums, also
    for the gradient, whose heatmap is max-abs) and of the heatmaps' magnitudes, and scikit-image's SSIM (5 x 5
    uniform window, data range 1) of the normalised true-class map with the random-class map, or the larger of that
    and the SSIM with its flip 1 - map where the two maps are not of one sign (the gradient's max-abs maps never
    are flipped)."""
    model, x, y = trained
    df = random_logit_test(model, x, y, [method], seed=4, progress=False)
    explainer = Explainer(model, method)
    raw = [explainer.attribute(x, target=torch.tensor(t)) for t in (df.true_class.to_numpy(),
                                                                      df.random_class.to_numpy())]
    true, rand = (heatmaps({method: r})[method] for r in raw)
    signed_true, signed_rand = (r.sum(1) for r in raw)
    a, b = normalize_map(true).numpy(), normalize_map(rand).numpy()
    flipped = 0
    for i, row in df.iterrows():
        assert row.spearman == pytest.approx(spearmanr(signed_true[i].flatten(), signed_rand[i].flatten())[0],
                                             abs=1e-12)
        assert row.spearman_abs == pytest.approx(spearmanr(true[i].abs().flatten(), rand[i].abs().flatten())[0],
                                                 abs=1e-12)
        one_sign = any(bool((true[i] * s >= 0).all() and (rand[i] * s >= 0).all()) for s in (1, -1))
        plain = structural_similarity(a[i], b[i], win_size=5, data_range=1.0)
        reference = plain if one_sign else max(plain, structural_similarity(a[i], 1.0 - b[i], win_size=5,
                                                                            data_range=1.0))
        flipped += not one_sign
        assert row.ssim == pytest.approx(reference, abs=1e-9)
    assert flipped == (0 if method == "gradient" else len(df))  # max-abs maps: one sign; LRP's: both signs
    assert np.isfinite(df[["ssim", "spearman", "spearman_abs"]].to_numpy()).all()


def test_random_classes_differ_from_labels_and_cover_the_rest():
    y = torch.zeros(5000, dtype=torch.long)
    r = random_classes(y, 10, seed=3)
    assert (r != 0).all() and set(r.tolist()) == set(range(1, 10))



def test_non_finite_weights_or_outputs_are_refused_before_any_map(trained):
    model, x, y = trained
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.features[0].weight[0, 0, 0, 0] = float("nan")
    for check in (random_logit_test, parameter_randomization):
        with pytest.raises(AuditError, match="NaN or infinite values in 1 tensor.*features.0.weight"):
            check(broken, x, y, ["gradient"], progress=False)
    huge = copy.deepcopy(model)
    with torch.no_grad():
        huge.classifier[-1].weight.mul_(1e38)  # finite weights, overflowing logits
    with pytest.raises(AuditError, match="outputs are NaN or infinite"):
        random_logit_test(huge, x * 1e30, y, ["gradient"], progress=False)


def test_constant_maps_give_undefined_scores_not_a_verdict(trained):
    model, x, y = trained
    dead = copy.deepcopy(model)
    with torch.no_grad():
        dead.features[0].weight.zero_()  # no path from the input: every gradient map is all zero
    df = random_logit_test(dead, x, y, ["gradient", "edge"], progress=False)
    assert df[df.method == "gradient"][["ssim", "spearman", "spearman_abs"]].isna().all().all()
    assert df[df.method == "edge"].ssim.notna().all()


def test_half_precision_images_are_computed_in_the_models_precision_and_said(trained):
    model, x, y = trained
    with pytest.warns(UserWarning, match="x is torch.float16; the audit computes in the model's torch.float32"):
        half = random_logit_test(model, x.half(), y, ["gradient"], progress=False)
    assert half.ssim.notna().all()
