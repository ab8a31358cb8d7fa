"""Parameter randomization: cascading, independent and bottom-up stages, BatchNorm policies, bad input."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from attributions import memory
from attributions.explainer import Explainer, shared_forward
from attributions.graph import trace
from audit import (
    parameter_randomization,
    random_logit_test,
)
from audit.checks import randomization
from audit.checks.base import INCONCLUSIVE, NOT_REJECTED, REJECTED
from audit.checks.randomization import (
    CascadingOptions,
    StageMaps,
    Survival,
    frame,
    randomization_stages,
    stage_columns,
    unchanged_nodes,
)
from audit.checks.replicates import replicate_seed
from audit.checks.stage_options import StageSettings
from audit.checks.stages import randomization_plan
from audit.errors import AuditError, ConfigError
from audit.models import build


def test_cascading_randomization(trained):
    model, x, y = trained
    before = copy.deepcopy(model.state_dict())
    torch.manual_seed(123)
    df = parameter_randomization(model, x, y, ["gradient", "edge", "lrp-zplus"], seed=0, progress=False)
    assert list(df.columns) == ["method", "stage", "layer", "image", "replicate", "ssim", "spearman", "spearman_abs", "hog",
                                "input_spearman_abs", "edge_spearman_abs", "share"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    layers = [s.name for s in randomization_plan(model, trace(model, x))]
    assert layers == ["features.0", "features.3", "features.5", "features.8", "classifier.0", "classifier.2"]
    order = df[df.method == "gradient"].drop_duplicates("stage").layer.tolist()
    assert order == ["original"] + layers[::-1]
    med = df.groupby(["method", "stage"]).ssim.median()
    assert (df[df.method == "edge"].ssim >= 0.99).all()
    assert med["gradient", len(layers)] < 0.5
    # the edge map's magnitude follows the input at every stage; the random control's does not at all
    follows = df.groupby("method").input_spearman_abs.median()
    assert follows["edge"] > 0.5 and abs(follows["gradient"]) < follows["edge"]
    torch.manual_seed(999)  # the global RNG does not matter: each layer has its own seeded generator
    again = parameter_randomization(model, x, y, ["gradient", "edge", "lrp-zplus"], seed=0, progress=False)
    assert df.equals(again)


def _resnet_with_trained_statistics() -> tuple[nn.Module, list]:
    """A seeded ResNet whose BatchNorm statistics are not the initial 0 / 1 (as a trained model's), and its layer plan."""
    torch.manual_seed(0)
    model = build("resnet").eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model, randomization_plan(model, trace(model, torch.rand(2, 1, 28, 28)), "layer")


def test_independent_stages_on_one_copy_change_only_their_own_layer_batchnorm_statistics_included():
    """The independent stages share one copy: each stage's parts are trained again (parameters and a BatchNorm's
    statistics) before the next stage's are drawn, so that every stage differs from the trained model in its own
    modules only, as a fresh copy per stage would."""
    model, plan = _resnet_with_trained_statistics()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    seen_batchnorm = 0
    for stage, name, m in randomization_stages(model, StageSettings(order="independent", bn="reset", seed=1), plan=plan):
        changed = {k.rsplit(".", 1)[0] for k, v in m.state_dict().items() if not torch.equal(v, original[k])}
        own = {part.holder for part in plan[-stage].parts} if stage else set()
        assert changed <= own and (changed or not stage), (name, changed, own)
        seen_batchnorm += any(part.batchnorm for part in plan[-stage].parts) if stage else 0
    assert seen_batchnorm >= 2  # BatchNorm stages followed by others: their statistics were restored
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())  # the model itself untouched


def test_independent_and_bottom_up_orders_and_batchnorm_policy():
    model, plan = _resnet_with_trained_statistics()
    settings = StageSettings(order="independent", bn="keep-stats", seed=1)
    stages = list((s, n, {k: v.clone() for k, v in m.state_dict().items()})
                  for s, n, m in randomization_stages(model, settings, plan=plan))
    original = stages[0][2]
    for _stage, name, state in stages[1:4]:
        changed = {k.rsplit(".", 1)[0] for k in state if not torch.equal(state[k], original[k])}
        assert changed == {name}, (name, changed)  # one layer at a time; BatchNorm statistics kept
    bottom = [n for _, n, _ in randomization_stages(model, StageSettings(order="bottom-up", seed=1), plan=plan)]
    assert bottom[1] == "conv1" and bottom[-1] == "fc"
    _, _, reset_model = next(s for s in randomization_stages(model, StageSettings(seed=1), plan=plan)
                             if s[1] == "layer3.2.conv2")
    bn = reset_model.layer3[2].bn2
    assert torch.equal(bn.running_mean, torch.zeros(64)) and torch.equal(bn.weight.data, torch.ones(64))


@pytest.mark.parametrize("order", ["cascading", "independent", "bottom-up"])
@pytest.mark.parametrize("methods", [["gradient", "lrp-epsilon-plus", "deeplift"], ["gradient", "input-x-gradient"]])
def test_reused_forward_values_change_nothing(order, methods, monkeypatch):
    # the stages take the trained model's values for the nodes below their re-initialised layers; the
    # tables must be those of recomputing every node (BatchNorm folded into the convolutions included). Exact
    # gradients alone run on a pass autograd records whole: the gradient reaches the input through the values
    # taken from the trained model's pass
    torch.manual_seed(0)
    model = build("resnet").eval()
    x, y = torch.rand(3, 1, 28, 28), torch.tensor([1, 4, 7])
    reused = parameter_randomization(model, x, y, methods, order=order, progress=False)
    monkeypatch.setattr(randomization, "unchanged_nodes", lambda graph, changed: frozenset())
    assert reused.equals(parameter_randomization(model, x, y, methods, order=order, progress=False))


@pytest.mark.parametrize("order", ["cascading", "bottom-up"])
def test_consecutive_images_share_a_seed_and_each_is_scored_as_under_that_seed_alone(trained, order):
    """Images 2r and 2r + 1 are randomized with replicate r's seed: their rows equal a one-seed run of those images
    alone with that seed; a block that starts at image 3 of the run keeps the seeds its images have in the run."""
    model, x, y = trained
    methods = ["gradient", "lrp-zplus"]
    shared = parameter_randomization(model, x, y, methods, progress=False, order=order, seed=5)
    assert shared.replicate.tolist() == (shared.image // 2).tolist() and shared.replicate.max() == 3
    scores = ["ssim", "spearman", "spearman_abs", "hog"]
    for r in range(4):
        alone = parameter_randomization(model, x[2 * r:2 * r + 2], y[2 * r:2 * r + 2], methods, progress=False,
                                        order=order, seed=replicate_seed(5, r), images_per_seed=2)
        mine = shared[shared.replicate == r]
        assert mine.layer.tolist() == alone.layer.tolist() and mine.method.tolist() == alone.method.tolist()
        np.testing.assert_allclose(mine[scores].to_numpy(float), alone[scores].to_numpy(float), atol=1e-4)
    assert replicate_seed(5, 0) == 5 and len({replicate_seed(5, r) for r in range(4)} | {6}) == 5
    block = parameter_randomization(model, x[3:], y[3:], methods, progress=False, order=order, seed=5,
                                    first_image=3)
    whole = shared[shared.image >= 3].reset_index(drop=True)
    assert (block.image + 3).tolist() == whole.image.tolist() and block.replicate.tolist() == whole.replicate.tolist()
    np.testing.assert_allclose(block[scores].to_numpy(float), whole[scores].to_numpy(float), atol=1e-4)  # another batch


def test_images_per_seed_must_be_a_positive_count():
    with pytest.raises(ValueError, match="images_per_seed must be a positive integer"):
        StageSettings(images_per_seed=0)


def test_the_trained_pass_is_kept_for_reuse_only_where_the_budget_has_room(trained, monkeypatch):
    model, x, y = trained
    ex = Explainer(model, "gradient", graph=trace(model, x))
    one_pass = ex.bytes_per_image(x) * len(x)  # the estimate the shared forward pass is held to
    held = memory.tensor_bytes(shared_forward({"gradient": ex}, x).values)
    asked = []
    spy = randomization.unchanged_nodes
    monkeypatch.setattr(randomization, "unchanged_nodes", lambda g, changed: asked.append(changed) or spy(g, changed))
    free = parameter_randomization(model, x, y, ["gradient"], images_per_seed=8, progress=False)  # one pass of all the images
    assert asked
    asked.clear()
    with memory.limit(max(2 * one_pass, 3 * held)):  # room for the trained pass besides a stage's own
        assert parameter_randomization(model, x, y, ["gradient"], images_per_seed=8, progress=False).equals(free)
    assert asked
    asked.clear()
    with memory.limit(held):  # no shared pass fits: every stage in chunks of images, nothing kept
        tight = parameter_randomization(model, x, y, ["gradient"], images_per_seed=8, progress=False)
    assert not asked
    # chunked maps equal batched ones to float32 rounding (attributions.memory); a rank may swap
    for column, atol in (("ssim", 1e-5), ("spearman", 1e-5), ("hog", 1e-4)):
        np.testing.assert_allclose(tight[column], free[column], atol=atol)


def test_unchanged_nodes_are_upstream_of_every_change(trained):
    model, x, _ = trained
    graph = trace(model, x)
    assert unchanged_nodes(graph, set()) == frozenset(graph.layers)
    top = unchanged_nodes(graph, {"classifier.2"})
    assert "classifier.1" in top and "classifier.2" not in top
    assert unchanged_nodes(graph, {"features.0"}) == frozenset()
    assert "features.4" in unchanged_nodes(graph, {"features.5", "classifier.2"})


def test_randomization_bad_input(trained):
    model, x, y = trained
    with pytest.raises(ConfigError, match="unknown order 'top-down'"):
        parameter_randomization(model, x, y, "gradient", order="top-down", progress=False)
    with pytest.raises(ConfigError, match="unknown BatchNorm policy"):
        parameter_randomization(model, x, y, "gradient", bn="freeze", progress=False)
    with pytest.raises(ConfigError, match="unknown target"):
        parameter_randomization(model, x, y, "gradient", target="random", progress=False)
    with pytest.raises(AuditError, match="labels out of range"):
        parameter_randomization(model, x, y + 20, "gradient", progress=False)
    with pytest.raises(AuditError, match="shape"):
        random_logit_test(model, x, y[:-1], "gradient", progress=False)



def test_stage_columns_hold_one_row_per_stage_method_and_image_in_that_order():
    batch = [StageMaps(s, name, {}, share) for s, name, share in [(0, "original", 0.0), (1, "fc", 0.25)]]
    scores = {m: {"ssim": np.arange(6.0) + 10 * k} for k, m in enumerate(["a", "b"])}  # 2 stages x 3 images
    df = frame([stage_columns(batch, 3, scores)], ["method", "stage", "layer", "image", "ssim", "share"])
    want = [(m, s.stage, s.layer, i, scores[m]["ssim"][k * 3 + i], s.share)
            for k, s in enumerate(batch) for m in scores for i in range(3)]
    assert list(df.itertuples(index=False, name=None)) == want
    assert df.stage.dtype == np.int64 and df.image.dtype == np.int64 and pd.api.types.is_string_dtype(df.method)
    assert frame([], ["method", "ssim"]).columns.tolist() == ["method", "ssim"]


def test_the_stage_figure_draws_the_random_controls_median_per_stage_in_every_panel():
    """The random map's median at each randomized stage (0.1 after the first) is the dotted floor of every family's
    panel; stage 0, where every map meets itself, has none."""
    rows = [{"model": "m", "method": method, "stage": stage, "layer": ["original", "fc"][stage], "image": i,
             "replicate": i // 2, "ssim": level[stage] + 0.01 * i}
            for method, level in (("gradient", (1.0, 0.3)), ("lrp-zplus", (1.0, 0.95)), ("random", (0.04, 0.09)))
            for stage in (0, 1) for i in range(3)]
    figure = randomization.randomization_figure(pd.DataFrame(rows), "m", "cascading")
    panels = [ax for ax in figure.figure.axes if ax.get_lines()]
    assert len(panels) == 3 and "dotted grey" in figure.caption
    for ax in panels:
        dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert len(dotted) == 1 and np.allclose(dotted[0].get_ydata(), [0.1])


def _cascade(*medians, n=40, noise=0.01, exact=False):
    """One model x method's cascading rows: stage 0 (1, the map against itself) and one stage per median; each
    image jittered around it (``exact``: every image at the median)."""
    rng = np.random.default_rng(0)
    return pd.DataFrame([{"stage": s, "layer": f"s{s}", "image": i, "replicate": i // 2,
                          "ssim": 1.0 if s == 0 else m + (0 if exact else rng.normal(0, noise))}
                         for s, m in enumerate((1.0, *medians)) for i in range(n)])


SURVIVAL = Survival("cascading_ssim", "cascading", "survives")


@pytest.mark.parametrize("medians, outcome", [
    # 0.60 after the logits, 0.30 at full randomization (nearer unrelated than 0.5): 0.60 is nearer the fully
    # randomized model's map than the trained one's (0.65 is halfway): not rejected
    ((0.60, 0.45, 0.30), NOT_REJECTED),
    ((0.45, 0.20, 0.05), NOT_REJECTED),
    # 0.40 against -0.30 (halfway 0.35): the map kept more of itself than of the untrained model's: rejected
    ((0.40, 0.00, -0.30), REJECTED),
    # exactly halfway (0.6 against 0.2): inconclusive
    ((0.60, 0.40, 0.20), INCONCLUSIVE),
    # the fully randomized model keeps 0.91 (input x gradient's |map| on the shipped CNNs): nearer unchanged (1)
    # than unrelated (0), rejected whatever the curve's shape between 1 and the floor
    ((0.93, 0.92, 0.91), REJECTED),
    # a floor at the scale's midpoint: changed at the top, but whether a model that learned nothing gives the same
    # map is open: inconclusive
    ((0.70, 0.60, 0.50), INCONCLUSIVE)])
def test_a_map_survives_a_stage_when_it_lies_nearer_the_trained_map_than_the_fully_randomized_models(
        medians, outcome):
    cell = SURVIVAL.evaluate(_cascade(*medians), CascadingOptions())
    assert cell.outcome == outcome, cell.text
    assert cell.score == pytest.approx(medians[0], abs=0.01)
    assert ("does not depend on the weights" in cell.text) == (medians[-1] > 0.5)


def test_the_floor_is_read_on_the_controls_scale():
    """The random map scoring 0.2 and the edge map 1.0 at the randomized stages put the midpoint at 0.6: a floor
    of 0.55 is then nearer the unrelated end, where the measure's own ends (0.5) would call it unchanged; and 0.56
    after the logit layer lies under its survival level (1 + 0.55) / 2 = 0.775: not rejected."""
    rows = _cascade(0.56, 0.555, 0.55, noise=0.0)
    controls = pd.concat([_cascade(1.0, 1.0, 1.0, exact=True).assign(method="edge"),
                          _cascade(0.2, 0.2, 0.2, exact=True).assign(method="random")])
    assert SURVIVAL.evaluate(rows, CascadingOptions()).outcome == REJECTED
    measured = SURVIVAL.evaluate(rows, CascadingOptions(), controls=controls)
    assert measured.outcome == NOT_REJECTED and "no controls run" not in measured.text
    assert SURVIVAL.scale(controls).midpoint == pytest.approx(0.6)  # read at the randomized stages only
    assert "does not depend on the weights" not in measured.text


def test_the_curves_ends_where_the_stages_give_no_floor():
    # a map the same on every model (the edge detector): its floor is the trained map itself
    edge = SURVIVAL.evaluate(_cascade(1.0, 1.0, 1.0, exact=True), CascadingOptions())
    assert edge.outcome == REJECTED and "the fully randomized model keeps it" in edge.text
    # one stage: the top part is the whole model, and the floor's reading is the check
    alone = SURVIVAL.evaluate(_cascade(0.3), CascadingOptions())
    assert alone.outcome == NOT_REJECTED and "the top part is the whole model" in alone.text
    # the untrained model's maps constant on most images: a constant map shares nothing with the trained one, its
    # survival level the scale's midpoint
    rows = _cascade(0.3, 0.2, 0.1)
    rows.loc[(rows.stage == 3) & (rows.image < 30), "ssim"] = np.nan
    constant = SURVIVAL.evaluate(rows, CascadingOptions())
    assert constant.outcome == NOT_REJECTED and "30 constant maps of the fully randomized model read as unrelated" \
        in constant.text
    # on a few: the map scored at the stage keeps its place
    rows.loc[(rows.stage == 3) & (rows.image >= 5), "ssim"] = 0.1
    assert SURVIVAL.evaluate(rows, CascadingOptions()).outcome == NOT_REJECTED
    assert SURVIVAL.evaluate(rows, CascadingOptions()).undefined == 0
    # the top part as two stages reads both against the floor: the second is not survived
    two = SURVIVAL.evaluate(_cascade(0.9, 0.5, 0.2), CascadingOptions(randomization_top=2))
    assert two.outcome == NOT_REJECTED and "survives 1 of 3 stages, stops at s2" in two.text
