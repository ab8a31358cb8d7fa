"""PatternNet / PatternAttribution: Kindermans et al.'s signal-and-distractor example, the conv statistics
against explicit patches, refitting when the weights change, saved patterns bound to their weights."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError
from attributions.fitting import fit_patterns
from attributions.patterns import Patterns


def _signal_and_distractor(n: int = 20000):
    """x = a_s s + a_d d (Kindermans et al. 2018, section 2): a_s = (1, 0), a_d = (1, 1); the model that
    recovers the signal, y = w^T x = s, needs w orthogonal to a_d: w = (1, -1)."""
    gen = torch.Generator().manual_seed(0)
    s, d = torch.randn(n, 1, generator=gen, dtype=torch.float64), torch.randn(n, 1, generator=gen, dtype=torch.float64)
    x = s * torch.tensor([[1.0, 0.0]], dtype=torch.float64) + d * torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    model = nn.Linear(2, 1, bias=False).double()
    model.weight.data = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    return model, x, s


def test_the_linear_pattern_recovers_the_signal_direction_and_the_gradient_does_not():
    model, x, s = _signal_and_distractor()
    torch.testing.assert_close(model(x), s)  # the model extracts the signal exactly
    patterns = fit_patterns(model, x, estimator="linear", source="synthetic")
    (a,) = patterns.patterns.values()
    torch.testing.assert_close(a, torch.tensor([[1.0, 0.0]], dtype=torch.float64), atol=0.03, rtol=0)  # a_s
    probe = x[:3]
    gradient = Explainer(model, "gradient").attribute(probe, target=0)
    torch.testing.assert_close(gradient, torch.tensor([[1.0, -1.0]] * 3, dtype=torch.float64))  # the filter, not a_s
    net = Explainer(model, "patternnet", estimator="linear", data=x).attribute(probe, target=0)
    torch.testing.assert_close(net, a.expand(3, 2))
    attribution = Explainer(model, "patternattribution", estimator="linear", patterns=patterns).attribute(probe, target=0)
    torch.testing.assert_close(attribution, (model.weight * a).expand(3, 2))  # w * a = (1, 0): the signal's input


def test_conv_statistics_pool_patches_as_the_formula_over_unfolded_inputs():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 36, 4)).double().eval()
    x = torch.randn(5, 2, 6, 6, dtype=torch.float64)
    fitted = fit_patterns(model, x, estimator="relu", batch=2).patterns  # statistics summed over chunks
    conv = model[0]
    patches = F.unfold(x, 3, padding=1).transpose(1, 2).reshape(-1, 18)  # (images x positions, inputs)
    w = conv.weight.reshape(3, -1)
    y = patches @ w.T  # the linear part, bias left out
    expected = []
    for j in range(3):
        keep = y[:, j] > 0
        xs, ys = patches[keep], y[keep, j]
        cov = (xs * ys[:, None]).mean(0) - xs.mean(0) * ys.mean()
        expected.append(cov / (w[j] @ cov))
    torch.testing.assert_close(fitted["0"], torch.stack(expected).reshape(conv.weight.shape))
    assert set(fitted) == {"0", "3"}  # every conv and dense layer


def test_patterns_are_refitted_when_the_weights_change_and_saved_ones_are_bound_to_theirs(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(4 * 16, 3)).double().eval()
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64)
    ex = Explainer(model, "patternattribution")
    before = ex.attribute(x, target=1)
    saved = fit_patterns(model, x).save(tmp_path / "p.pt")
    with torch.no_grad():  # a randomization stage, in place
        model[4].weight.normal_()
    after = ex.attribute(x, target=1)
    torch.testing.assert_close(after, Explainer(model, "patternattribution").attribute(x, target=1), rtol=0, atol=0)
    assert not torch.allclose(before, after)
    with pytest.raises(AttributionError, match="fitted on other weights"):
        Explainer(model, "patternattribution", patterns=Patterns.load(saved)).attribute(x, target=1)
    refit = fit_patterns(model, x, source="the six probe images")
    loaded = Patterns.load(refit.save(tmp_path / "q.pt"))
    assert loaded.source == "the six probe images" and loaded.n == 6 and loaded.estimator == "relu"
    torch.testing.assert_close(Explainer(model, "patternattribution", patterns=loaded).attribute(x, target=1), after,
                               rtol=0, atol=0)
    (tmp_path / "broken.pt").write_bytes(b"not a tensor file")
    with pytest.raises(AttributionError, match="not a patterns file"):
        Patterns.load(tmp_path / "broken.pt")
    with pytest.raises(AttributionError, match="estimator"):
        Explainer(model, "patternnet", estimator="quadratic")


def test_chunked_maps_use_the_patterns_of_the_whole_batch(monkeypatch):
    from attributions import memory

    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)).double().eval()
    x = torch.rand(6, 1, 8, 8, dtype=torch.float64)
    whole = Explainer(model, "patternnet").attribute(x, target=0)
    monkeypatch.setattr(memory, "fitting", lambda n, *args, **kwargs: 2)  # two images per pass
    torch.testing.assert_close(Explainer(model, "patternnet").attribute(x, target=0), whole)


def test_a_cache_holds_the_trained_models_patterns_and_a_randomized_model_is_refitted(tmp_path, monkeypatch):
    from attributions import patterns as P

    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 3)).double().eval()
    data, x = torch.rand(10, 1, 8, 8, dtype=torch.float64), torch.rand(3, 1, 8, 8, dtype=torch.float64)
    cache, trained = tmp_path / "cnn.patterns.pt", P.fingerprint(model)
    params = {"data": data, "cache": cache, "cache_for": trained, "source": "10 training images"}
    fits = []
    real = P.fit_nodes
    monkeypatch.setattr(P, "fit_nodes", lambda *a, **k: fits.append(1) or real(*a, **k))
    first = Explainer(model, "patternattribution", **params).attribute(x, target=1)
    assert len(fits) == 1 and Patterns.load(cache).fingerprint == trained and Patterns.load(cache).n == 10
    # fitted on data, not on the explained images
    torch.testing.assert_close(first, Explainer(model, "patternattribution", data=data).attribute(x, target=1),
                               rtol=0, atol=0)
    fits.clear()
    again = Explainer(model, "patternattribution", **params).attribute(x, target=1)  # a new run: read, not refitted
    assert fits == [] and torch.equal(again, first)
    with torch.no_grad():
        model[3].weight.normal_()  # a randomized stage: its own patterns, on the same images; the cache stays
    stage = Explainer(model, "patternattribution", **params).attribute(x, target=1)
    assert len(fits) == 1 and Patterns.load(cache).fingerprint == trained
    torch.testing.assert_close(stage, Explainer(model, "patternattribution", data=data).attribute(x, target=1),
                               rtol=0, atol=0)
    with pytest.raises(AttributionError, match="cache_for"):
        Explainer(model, "patternnet", data=data, cache=cache)


def test_the_two_component_estimator_recovers_each_regimes_signal_direction():
    """x = s a(s) + d a_d with a+ = (1, 0) for s > 0 and a- = (0, -1) for s < 0, a_d = (1, 1), w = (1, -1):
    y = s in both regimes, and the two-component patterns are a+ and a- (the linear one mixes them)."""
    gen = torch.Generator().manual_seed(1)
    n = 40000
    s, d = torch.randn(n, 1, generator=gen, dtype=torch.float64), torch.randn(n, 1, generator=gen, dtype=torch.float64)
    plus, minus = torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    x = torch.where(s > 0, s * plus, s * minus) + d * torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    model = nn.Linear(2, 1, bias=False).double()
    model.weight.data = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(model(x), s)
    (a,) = fit_patterns(model, x, estimator="two-component").patterns.values()
    assert a.shape == (2, 1, 2)
    torch.testing.assert_close(a[0], plus, atol=0.03, rtol=0)
    torch.testing.assert_close(a[1], minus, atol=0.03, rtol=0)
    (linear,) = fit_patterns(model, x, estimator="linear").patterns.values()
    assert (linear - plus).abs().max() > 0.2 and (linear - minus).abs().max() > 0.2
    probes = torch.tensor([[2.0, 0.5], [0.5, 2.0]], dtype=torch.float64)  # y = 1.5 and y = -1.5
    net = Explainer(model, "patternnet", estimator="two-component", data=x).attribute(probes, target=0)
    torch.testing.assert_close(net, torch.cat([a[0], a[1]]), rtol=0, atol=0)


def test_behind_the_relus_of_bias_free_layers_two_component_equals_relu():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 64, 16, bias=False), nn.ReLU(), nn.Linear(16, 3)).double().eval()
    data, x = torch.randn(12, 1, 8, 8, dtype=torch.float64), torch.randn(3, 1, 8, 8, dtype=torch.float64)
    for method in ("patternnet", "patternattribution"):
        relu = Explainer(model, method, estimator="relu", data=data).attribute(x, target=2)
        both = Explainer(model, method, estimator="two-component", data=data).attribute(x, target=2)
        assert relu.abs().max() > 0
        torch.testing.assert_close(both, relu, rtol=1e-12, atol=1e-14)


def test_too_few_samples_for_any_covariance_of_a_layer_is_a_clear_warning():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    x = torch.randn(64, 6, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"patterns of 0 \(and 1 more layer\(s\)\) cannot be estimated from 1 "
                      r"image.*two samples"):
        fit_patterns(model, x[:1], estimator="linear")  # one sample per unit: every covariance is zero
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = fit_patterns(model, x, estimator="linear").patterns
    assert all(p.abs().sum() > 0 for p in fitted.values())
    maps = Explainer(model, "patternnet", data=x).attribute(x[:1], target=0)
    assert maps.abs().sum() > 0
