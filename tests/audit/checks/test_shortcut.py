"""The planted-shortcut check held to its known answer: on hand-built tag readers (one whose c* logit reads the tag,
one that ignores it) the gradient's and DeepLIFT's shares inside the tag are derived from the weights and the image
alone, and the check must give them to float precision, not reject the gradient, and reject the edge and random
controls."""
import numpy as np
import pandas as pd
import pytest
import torch

from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.checks.options import Options
from audit.checks.shortcut import VIEWS, ShowsReliance, shortcut_test, tag_shares
from audit.data.datasets import embedded_sample
from audit.data.tags import Tag
from audit.errors import AuditError, ConfigError
from audit.models.tag_readers import BIAS, tag_reader

TAG = Tag(target=0, pattern="checker", size=4, place="top-left")
RULE = ShowsReliance("shortcut", "shortcut_text", "does not show the shortcut")


@pytest.fixture(scope="module")
def images():
    """32 embedded images, the tag's class among them (left out by the check)."""
    x, y = embedded_sample()
    return torch.from_numpy(x[::31][:32]), torch.from_numpy(y[::31][:32])


@pytest.fixture(scope="module")
def run(images):
    x, y = images
    uses, ignores = tag_reader(TAG), tag_reader(TAG, uses_tag=False)
    return shortcut_test(uses, ignores, TAG, x, y, "gradient,deeplift,edge,random", keep_maps=3)


def derived(x: np.ndarray, method: str, uses_tag: bool) -> np.ndarray:
    """(N,) the share of |map| inside the tag, by hand: logit c* = u relu(z0) + v relu(z1), z = W x + BIAS, with
    (u, v) = (1, 0.5) or (0, 1). The gradient is u 1[z0 > 0] a + v 1[z1 > 0] b; DeepLIFT (Rescale, zero reference,
    whose hidden values are BIAS) is x (u m0 a + v m1 b) with m = (relu(z) - relu(BIAS)) / (z - BIAS)."""
    reader = tag_reader(TAG, uses_tag=uses_tag)
    w = reader[1].weight.detach().double().numpy()  # (2, 784): a, b
    u, v = (1.0, 0.5) if uses_tag else (0.0, 1.0)
    flat = x.reshape(len(x), -1).astype(float)
    z = flat @ w.T + BIAS
    if method == "gradient":
        factor = (z > 0).astype(float)
    else:
        factor = np.where(np.abs(z - BIAS) > 1e-12, (np.maximum(z, 0) - BIAS) / np.where(z == BIAS, 1, z - BIAS),
                          1.0)
    maps = (u * factor[:, :1] * w[0] + v * factor[:, 1:] * w[1]) * (flat if method == "deeplift" else 1.0)
    inside = TAG.mask(28, 28).flatten().numpy()
    return np.abs(maps[:, inside]).sum(1) / np.abs(maps).sum(1)


@pytest.mark.parametrize("method", ["gradient", "deeplift"])
def test_the_shares_are_the_derived_ones_on_tagged_and_clean_images(run, images, method):
    df, _ = run
    x, y = images
    others = (y != TAG.target).numpy()
    rows = df[df.method == method].sort_values("image")
    assert rows.image.tolist() == np.flatnonzero(others).tolist()  # the tag's own class is left out
    tagged = TAG.paste(x[others]).numpy()
    np.testing.assert_allclose(rows.shortcut_share, derived(tagged, method, True), rtol=1e-5)
    np.testing.assert_allclose(rows.control_share, derived(tagged, method, False), atol=1e-7)
    np.testing.assert_allclose(rows.clean_shortcut_share, derived(x[others].numpy(), method, True), rtol=1e-5)
    assert (rows.shortcut_share > 0.3).all() and (rows.shortcut_share < 0.99).all()  # a number, not 0 or 1
    assert rows.area_share.eq(16 / 784).all() and rows.shortcut_predicts.all()


def test_the_gradient_is_not_rejected_and_both_controls_are(run):
    df, maps = run
    outcomes = {m: RULE.evaluate(part, Options()).outcome for m, part in df.groupby("method")}
    assert outcomes == {"gradient": NOT_REJECTED, "deeplift": NOT_REJECTED, "edge": REJECTED, "random": REJECTED}
    assert maps["gradient"].shape == (len(VIEWS), 3, 28, 28)
    edge = df[df.method == "edge"]
    assert np.array_equal(edge.shortcut_share, edge.control_share)  # a model-independent map: the same on both


def test_twins_given_the_wrong_way_round_reject_the_gradient(images):
    x, y = images
    df, _ = shortcut_test(tag_reader(TAG, uses_tag=False), tag_reader(TAG), TAG, x, y, "gradient")
    assert (df.difference < 0).all()
    assert RULE.evaluate(df, Options()).outcome == REJECTED


def test_a_difference_near_the_area_share_is_inconclusive_and_the_margin_is_the_tags_area():
    area = 16 / 784
    rows = pd.DataFrame({"method": "m", "image": range(40), "difference": area + np.linspace(-0.01, 0.01, 40),
                         "area_share": area, "twin_pair": 0})
    cell = RULE.evaluate(rows, Options())
    assert cell.outcome == INCONCLUSIVE and cell.reading is not None and cell.reading.at == area
    assert RULE.evaluate(rows.assign(difference=rows.difference + 0.05), Options()).outcome == NOT_REJECTED


def test_shares_are_undefined_where_a_map_is_zero_or_not_finite():
    maps = torch.ones(4, 3, 3)
    maps[1] = 0
    maps[2, 0, 0] = float("nan")
    mask = torch.zeros(3, 3, dtype=torch.bool)
    mask[0, :2] = True
    shares = tag_shares(maps, mask)
    assert shares[0] == pytest.approx(2 / 9) and np.isnan(shares[1]) and np.isnan(shares[2])


def test_bad_inputs_get_the_checks_own_errors(images):
    x, y = images
    uses = tag_reader(TAG)
    with pytest.raises(AuditError, match="needs the labels"):
        shortcut_test(uses, uses, TAG, x, None, "gradient")
    with pytest.raises(ConfigError, match="one tag control twin per shortcut twin"):
        shortcut_test([uses, uses], [uses], TAG, x, y, "gradient")
    with pytest.raises(ConfigError, match="architectures differ"):
        shortcut_test(uses, tag_reader(TAG, classes=9), TAG, x, y, "gradient")
    with pytest.raises(ConfigError, match="does not fit"):
        shortcut_test(uses, uses, Tag(size=30), x, y, "gradient")


def test_the_share_is_quantus_relevance_mass_accuracy_of_the_maps_magnitude(run):
    """Quantus's RelevanceMassAccuracy (Arras et al.) with abs=True and no normalisation: relevance inside the mask
    over all relevance; the same numbers, on random signed maps and on the check's own kept DeepLIFT maps."""
    quantus = pytest.importorskip("quantus")
    _, maps = run
    signed = np.random.default_rng(0).normal(size=(5, 28, 28)).astype(np.float32)
    deeplift = maps["deeplift"][0][np.isfinite(maps["deeplift"][0]).all(axis=(1, 2))]
    mask = TAG.mask(28, 28)
    for heat in (signed, deeplift.astype(np.float32)):
        metric = quantus.RelevanceMassAccuracy(abs=True, normalise=False, disable_warnings=True)
        theirs = metric(model=None, x_batch=np.zeros((len(heat), 1, 28, 28), np.float32), y_batch=np.zeros(len(heat), int),
                        a_batch=heat[:, None], s_batch=np.broadcast_to(mask.numpy(), (len(heat), 1, 28, 28)).astype(float),
                        channel_first=True)
        np.testing.assert_allclose(tag_shares(torch.from_numpy(heat), mask), theirs, rtol=1e-5)


def test_the_shipped_cnn_pair_passes_its_gate_and_both_controls_are_rejected_on_it():
    """cnn-sgd's shipped shortcut twins: the gate holds from their metadata, every demo method gets an outcome on 16
    embedded images, the edge and random maps are rejected and the gradient is not."""
    from audit.cli import DEMO_METHODS
    from audit.data.datasets import balanced_sample
    from audit.models import load_checkpoint
    from audit.models.shortcut_twins import gate
    from audit.models.twins import shipped_twin

    pair = [load_checkpoint(shipped_twin("cnn-sgd", role)) for role in ("shortcut", "tag-control")]
    checked = gate(pair[0].metadata, pair[1].metadata)
    assert checked.planted, checked.text
    tag = Tag.from_dict(pair[0].metadata["shortcut"]["tag"])
    x, y = balanced_sample("fashion-mnist-sample", 16)
    df, _ = shortcut_test(pair[0], pair[1], tag, x, y, DEMO_METHODS)
    outcomes = {m: RULE.evaluate(part, Options()).outcome for m, part in df.groupby("method")}
    assert set(outcomes) == set(DEMO_METHODS) and None not in outcomes.values()
    assert outcomes["edge"] == outcomes["random"] == REJECTED and outcomes["gradient"] == NOT_REJECTED
