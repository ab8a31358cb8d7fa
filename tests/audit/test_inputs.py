"""Bad input through the Python API, parametrised: every case gets the toolkit's own error type and a
message that names the offending value (no raw torch / numpy error, no silent result)."""
import copy

import pytest
import torch
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError, ToolkitError
from audit import (
    chain_convergence,
    efficient_mprt,
    input_invariance,
    parameter_randomization,
    random_logit_test,
    smooth_mprt,
)
from audit.data.datasets import embedded_sample
from audit.errors import AuditError, ConfigError, ModelError
from audit.inputs import check_finite_model
from audit.models import load_checkpoint

MODEL = load_checkpoint("cnn-sgd")
_X, _Y = embedded_sample()
X, Y = torch.from_numpy(_X[::125]), torch.from_numpy(_Y[::125])


def _nan_weights():
    broken = copy.deepcopy(MODEL)
    with torch.no_grad():
        broken.classifier[0].bias[3] = float("inf")
    return broken


CASES = {
    "model not a module": (lambda: random_logit_test("cnn-sgd", X, Y), AuditError, "nn.Module, got str"),
    "x with NaN": (lambda: random_logit_test(MODEL, X.clone().index_fill_(0, torch.tensor([2]), float("nan")), Y),
                   AuditError, "NaN or infinite"),
    "Explainer on a numpy array": (lambda: Explainer(MODEL, "gradient").attribute(X.numpy(), target=0),
                                   AttributionError, r"torch.Tensor \(B, ...\), got a numpy.ndarray"),
    "x integer": (lambda: random_logit_test(MODEL, (X * 255).to(torch.uint8), Y), AuditError, "floating-point"),
    "x without batch axis": (lambda: random_logit_test(MODEL, torch.rand(5), Y), AuditError, r"shape \(5,\)"),
    "y float": (lambda: random_logit_test(MODEL, X, Y.float()), AuditError, "y must be integer labels"),
    "y too short": (lambda: random_logit_test(MODEL, X, Y[:3]), AuditError, r"shape \(8,\).*\(3,\)"),
    "y out of range": (lambda: random_logit_test(MODEL, X, Y + 10), AuditError, r"labels out of range.*10 classes"),
    "y missing": (lambda: random_logit_test(MODEL, X, None), AuditError, "random_logit_test needs the labels y"),
    "unknown method": (lambda: random_logit_test(MODEL, X, Y, "gradiant"), ConfigError,
                       "unknown attribution method 'gradiant'.*gradient"),
    "no method": (lambda: random_logit_test(MODEL, X, Y, []), ConfigError, "no attribution method"),
    "unknown order": (lambda: parameter_randomization(MODEL, X, Y, ["gradient"], order="sideways"), ConfigError,
                      "unknown order 'sideways'"),
    "unknown BatchNorm policy": (lambda: parameter_randomization(MODEL, X, Y, ["gradient"], bn="freeze"), ConfigError,
                                 "'freeze'"),
    "unknown target": (lambda: parameter_randomization(MODEL, X, Y, ["gradient"], target="best"), ConfigError,
                       "unknown target 'best'"),
    "unknown init": (lambda: parameter_randomization(MODEL, X, Y, ["gradient"], init="xavier"), ConfigError,
                     "unknown re-initialisation 'xavier'"),
    "randomization without labels": (lambda: parameter_randomization(MODEL, X, None, ["gradient"]), AuditError,
                                      "parameter_randomization needs the labels y"),
    "eMPRT without labels": (lambda: efficient_mprt(MODEL, X, None, ["gradient"]), AuditError,
                             "efficient_mprt needs the labels y"),
    "eMPRT bins": (lambda: efficient_mprt(MODEL, X, Y, ["gradient"], n_bins=0), ConfigError, "n_bins.*got 0"),
    "sMPRT samples": (lambda: smooth_mprt(MODEL, X, Y, ["gradient"], n_samples=0), ConfigError, "got 0"),
    "sMPRT noise": (lambda: smooth_mprt(MODEL, X, Y, ["gradient"], noise=-0.1), ConfigError, "-0.1"),
    "shift per channel": (lambda: input_invariance(MODEL, X, Y, ["gradient"], shift=[1.0, 2.0]), AuditError,
                          "one number or one per input channel"),
    "invariance without labels": (lambda: input_invariance(MODEL, X, None, ["gradient"]), AuditError,
                                  "input_invariance needs the labels y"),
    "CSC unknown layer": (lambda: chain_convergence(MODEL, X, Y, ["gradient"], inject_at="features.99"),
                          ToolkitError, "features.99"),
    "infinite weight": (lambda: random_logit_test(_nan_weights(), X, Y), AuditError, "classifier.0.bias"),
    "wrong channels": (lambda: random_logit_test(MODEL, X.repeat(1, 3, 1, 1), Y), ModelError,
                       r"inputs of shape \(8, 3, 28, 28\)"),
    "CSC wrong image size": (lambda: chain_convergence(MODEL, X[:, :, :20, :20], Y, ["gradient"]), ModelError,
                             r"\(8, 1, 20, 20\)"),
    "randomization wrong channels": (lambda: parameter_randomization(MODEL, X.repeat(1, 2, 1, 1), Y, ["gradient"]),
                                     ModelError, r"\(8, 2, 28, 28\)"),
    "Explainer on a string": (lambda: Explainer("cnn-sgd", "gradient"), AttributionError, "got str"),
    "Explainer unknown method": (lambda: Explainer(MODEL, "lrp-epsilonn"), ToolkitError, "lrp-epsilonn"),
    "float target": (lambda: Explainer(MODEL, "gradient").attribute(X, target=2.9), AttributionError, "2.9"),
    "target out of range": (lambda: Explainer(MODEL, "gradient").attribute(X, target=12), AttributionError,
                            r"out of range.*10 classes.*12"),
    "rule on a wrong kind": (lambda: Explainer(MODEL, "lrp-epsilon", rules={"relu": "zplus"}).attribute(X, target=0),
                             AttributionError,
                             "cannot act on node 'features.1' of kind 'relu'"),
    "unknown rule": (lambda: Explainer(MODEL, "lrp-epsilon", rules={"conv": "zplsu"}), AttributionError, "zplsu"),
    "float64 inputs for a float32 model": (lambda: Explainer(MODEL, "gradient").attribute(X.double(), target=0),
                                           AttributionError, "torch.float64 but the model computes in torch.float32"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_our_error_naming_the_value(case):
    call, error, message = CASES[case]
    with pytest.raises(error, match=message):
        call()


def test_a_model_whose_values_sum_past_the_float_range_is_finite_and_one_with_nan_is_named():
    layer = nn.Linear(3, 3)
    with torch.no_grad():
        layer.weight.fill_(3e38)  # finite, its sum is not
    check_finite_model(layer)
    with torch.no_grad():
        layer.bias[1] = float("nan")
    with pytest.raises(AuditError, match=r"NaN or infinite values in 1 tensor\(s\): bias;"):
        check_finite_model(layer)
