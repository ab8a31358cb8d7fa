"""Parity with Quantus (a test dependency only): its MPRT, EfficientMPRT and SmoothMPRT run on exactly our
randomized models (its layer generator replaced by ours: Quantus re-seeds every layer with the same
seed and walks modules in registration order, ours seeds per layer and follows the forward order)
and on our maps, and must give our scores."""
import numpy as np
import pytest
import torch

from attributions import Explainer
from attributions.graph import trace
from audit import efficient_mprt, parameter_randomization, random_logit_test, smooth_mprt
from audit.checks import random_logit
from audit.checks.randomization import randomization_stages
from audit.checks.stage_options import StageSettings
from audit.checks.stages import randomization_plan
from audit.measures.heatmaps import heatmaps

quantus = pytest.importorskip("quantus")
from quantus.helpers.model.pytorch_model import PyTorchModel  # noqa: E402  (after the skip)


def _explain(method: str, signed: bool = False):
    """Our heatmaps as Quantus's explain function; ``signed``: the signed channel sum (the map our signed
    Spearman reads, also where the method's heatmap is max-abs)."""
    def explain(model, inputs, targets, **kwargs):
        maps = Explainer(model, method).attribute(torch.as_tensor(inputs), target=torch.as_tensor(targets))
        heatmap = maps.sum(1) if signed else heatmaps({method: maps})[method]
        return heatmap[:, None].numpy()  # (B, 1, H, W), as Quantus expects
    return explain


def _use_our_stages(monkeypatch, model, order: str, x) -> None:
    plan = randomization_plan(model, trace(model, torch.as_tensor(x)))

    def generator(self, order_=None, seed=0, **kwargs):
        stages = randomization_stages(model, StageSettings(order=order), plan=plan)
        next(stages)  # stage 0 is the trained model: Quantus yields randomized ones only
        for _, name, stage_model in stages:
            yield name, stage_model

    monkeypatch.setattr(PyTorchModel, "get_random_layer_generator", generator)


@pytest.fixture
def our_stages(trained, monkeypatch):
    _use_our_stages(monkeypatch, trained[0], "bottom-up", trained[1])


@pytest.mark.parametrize("method", ["gradient", "lrp-zplus"])
def test_emprt_equals_quantus_efficient_mprt(trained, our_stages, method):
    model, x, y = trained
    metric = quantus.EfficientMPRT(layer_order="bottom_up", disable_warnings=True, display_progressbar=False)
    theirs = metric(model=model, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=None, explain_func=_explain(method),
                    device="cpu")
    ours = efficient_mprt(model, x, y, [method], seed=0, images_per_seed=8, progress=False)
    last = ours[ours.stage == ours.stage.max()].sort_values("image").score.to_numpy()
    np.testing.assert_allclose(last, np.asarray(theirs, dtype=float), rtol=1e-6, atol=1e-9)


def test_smprt_equals_quantus_smooth_mprt_without_noise(trained, our_stages):
    # one sample: Quantus's last sample is noise-free, as ours (its noise comes from numpy's global RNG).
    # Quantus 0.6's SmoothMPRT always calls quantus.explain (a custom explain_func is ignored there), so
    # the parity is for the plain gradient, which both compute.
    model, x, y = trained
    metric = quantus.SmoothMPRT(layer_order="bottom_up", nr_samples=1, disable_warnings=True, display_progressbar=False)
    theirs = metric(model=model, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=None, explain_func=quantus.explain,
                    explain_func_kwargs={"method": "Gradient"}, device="cpu")
    ours = smooth_mprt(model, x, y, ["gradient"], seed=0, images_per_seed=8, n_samples=1, progress=False)
    assert len(theirs) == ours.stage.nunique()
    for stage, scores in enumerate(theirs.values()):
        got = ours[ours.stage == stage].sort_values("image").spearman.to_numpy()
        np.testing.assert_allclose(got, np.asarray(scores, dtype=float), rtol=1e-6, atol=1e-9)


def test_cascading_randomization_equals_quantus_mprt(trained, monkeypatch):
    # Quantus's MPRT defaults (Spearman of |map| after second-moment normalisation) = our spearman_abs
    model, x, y = trained
    _use_our_stages(monkeypatch, model, "cascading", x)
    metric = quantus.MPRT(layer_order="top_down", disable_warnings=True, display_progressbar=False)
    theirs = metric(model=model, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=None,
                    explain_func=_explain("guided-backprop"), device="cpu")
    ours = parameter_randomization(model, x, y, ["guided-backprop"], seed=0, images_per_seed=8, progress=False)
    assert len(theirs) == ours.stage.nunique()
    for stage, scores in enumerate(theirs.values()):
        got = ours[ours.stage == stage].sort_values("image").spearman_abs.to_numpy()
        np.testing.assert_allclose(got, np.asarray(scores, dtype=float), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("method,magnitude", [("gradient", False), ("lrp-epsilon", False), ("lrp-epsilon", True)])
def test_random_logit_equals_quantus_random_logit(trained, monkeypatch, method, magnitude):
    # Quantus draws the other class from numpy's global RNG, ours from a seeded generator of its own: ours is
    # given Quantus's draw (the classes Quantus asks its explain function for). With Spearman as the
    # similarity, no normalisation, and |map| or the signed map, the definitions coincide; its default
    # SSIM on flattened maps does not (README: "Where our checks differ from Quantus").
    model, x, y = trained
    asked = []
    explain = _explain(method, signed=not magnitude)  # Spearman of the signed map and of |map| differ

    def recording(model, inputs, targets, **kwargs):
        asked.append(np.asarray(targets).copy())
        return explain(model, inputs, targets)

    metric = quantus.RandomLogit(num_classes=10, similarity_func=quantus.similarity_func.correlation_spearman,
                                 normalise=False, abs=magnitude, disable_warnings=True, display_progressbar=False)
    theirs = metric(model=model, x_batch=x.numpy(), y_batch=y.numpy(), a_batch=None, explain_func=recording,
                    device="cpu")
    other = torch.as_tensor(asked[-1])
    assert len(asked) == 2 and (other != y).all()
    monkeypatch.setattr(random_logit, "random_classes", lambda labels, classes, seed: other)
    ours = random_logit_test(model, x, y, [method], progress=False)
    assert (ours.random_class.to_numpy() == other.numpy()).all()
    column = "spearman_abs" if magnitude else "spearman"
    np.testing.assert_allclose(ours[column].to_numpy(), np.asarray(theirs, dtype=float), rtol=1e-6, atol=1e-9)
