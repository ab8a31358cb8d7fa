"""The checks held to maps of known model dependence: the mixture of the edge map and the gradient's, whose ends
the cascading check must reject (w = 0: no model dependence) and not reject (w = 1: the gradient), on a shipped
model; the mixture itself checked by hand."""
import pandas as pd
import pytest
import torch

from audit import embedded_sample, load_checkpoint
from audit.checks.known_answer import cascading_curve, data_randomization_curve, mixture, resolution
from audit.errors import AuditError, ConfigError
from audit.models import shipped_twins


def test_a_mixture_weighs_each_map_scaled_to_a_largest_magnitude_of_one():
    edge = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])
    gradient = torch.tensor([[[0.0, -4.0], [1.0, 0.0]]])
    # edge / 2 and gradient / 4, weighed 0.75 and 0.25
    expected = torch.tensor([[[0.75, -0.25], [0.0625, 0.375]]])
    torch.testing.assert_close(mixture(edge, gradient, 0.25), expected)
    assert torch.equal(mixture(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2), 0.5), torch.zeros(1, 2, 2))


def test_the_cascading_check_rejects_the_model_free_end_and_not_the_gradient_end():
    x, y = embedded_sample()
    curve, rows = cascading_curve(load_checkpoint("cnn-sgd"), torch.from_numpy(x[:16]), torch.from_numpy(y[:16]),
                                  weights=(0.0, 0.5, 1.0))
    outcomes = dict(zip(curve.weight, curve.outcome))
    assert outcomes[0.0] == "rejected" and "does not depend on the weights" in curve.text[0]
    assert outcomes[1.0] == "not rejected"
    # the edge map meets itself at every stage; the controls set the scale the verdict read
    edge = rows[(rows.method == "mixture@0") & (rows.stage > 0)]
    assert (edge.ssim > 0.999).all() and "no controls run" not in curve.text[0]
    assert resolution(curve) == 0.0  # the half-and-half mixture is not rejected (16 images: inconclusive)


def test_the_data_randomization_check_rejects_the_model_free_end_and_not_the_gradient_end():
    """On cnn-sgd's three twin pairs (24 images): the edge map is the same on every model, so an untrained copy
    keeps it (rejected, for that reason); the gradient's map changes (not rejected)."""
    x, y = embedded_sample()
    twins, controls = ([load_checkpoint(n) for n in shipped_twins("cnn-sgd", role)] for role in ("permuted", "control"))
    curve, rows = data_randomization_curve(load_checkpoint("cnn-sgd"), twins, torch.from_numpy(x[:24]),
                                           torch.from_numpy(y[:24]), weights=(0.0, 1.0), control=controls)
    outcomes = dict(zip(curve.weight, curve.outcome))
    assert outcomes[0.0] == "rejected" and "an untrained copy keeps the map" in curve.text[0]
    assert outcomes[1.0] == "not rejected" and "3 twin pairs resampled" in curve.text[1]
    edge = rows[rows.method == "mixture@0"]
    assert (edge.spearman_abs > 0.999).all() and sorted(rows.twin_pair.unique()) == [0, 1, 2]


def test_the_resolution_is_the_last_weight_of_the_rejected_run():
    curve = pd.DataFrame({"weight": [0.0, 0.2, 0.4, 0.6], "outcome": ["rejected", "rejected", "inconclusive",
                                                                       "rejected"]})
    assert resolution(curve) == 0.2
    assert resolution(curve.assign(outcome="not rejected")) is None
    with pytest.raises(ConfigError, match="weight must lie in"):
        cascading_curve(torch.nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), weights=(1.5,))
    x, y = embedded_sample()
    with pytest.raises(AuditError, match="labels"):  # the audit's own check of the images and labels
        cascading_curve(load_checkpoint("cnn-sgd"), torch.from_numpy(x[:4]), torch.from_numpy(y[:3]))
