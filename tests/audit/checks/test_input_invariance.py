"""Input invariance: Kindermans et al.'s theory reproduced, the compensation checked, bad models refused."""
import copy

import pytest
import torch
from torch import nn

from audit import input_invariance
from audit.checks.input_invariance import shifted_model
from audit.errors import AuditError

INVARIANT = ["gradient", "guided-backprop", "deconvnet", "smoothgrad", "rectgrad", "grad-cam", "guided-grad-cam", "edge",
             "random"]
NOT_INVARIANT = ["input-x-gradient", "lrp-epsilon", "lrp-zplus", "lrp-cmp-alpha1beta0", "integrated-gradients",
                 "deeplift"]


def test_theory_on_a_padded_cnn(trained):
    model, x, y = trained
    before = copy.deepcopy(model.state_dict())
    df = input_invariance(model, x, y, INVARIANT + NOT_INVARIANT, shift=-1.0, progress=False)
    assert list(df.columns) == ["method", "image", "relative_l2", "ssim"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    med = df.groupby("method").relative_l2.median()
    assert (med[INVARIANT] < 1e-5).all(), med[INVARIANT]
    assert (med[NOT_INVARIANT] > 0.1).all(), med[NOT_INVARIANT]
    assert (df[df.method.isin(["gradient", "edge"])].ssim > 0.999).all()


def test_deeplift_and_ig_are_invariant_with_the_shifted_reference(trained):
    """Kindermans et al.: the maps of DeepLIFT and integrated gradients change with the shift from a
    zero reference, and do not from the reference shifted alike (the image of the original zero)."""
    model, x, y = trained
    methods = ["deeplift", "integrated-gradients", "deeplift-ablation", "gradient"]
    zero = input_invariance(model, x, y, methods, shift=-1.0, progress=False).groupby("method").relative_l2.median()
    moved = input_invariance(model, x, y, methods, shift=-1.0, progress=False, reference="shifted")
    med = moved.groupby("method").relative_l2.median()
    assert (zero[["deeplift", "integrated-gradients", "deeplift-ablation"]] > 0.1).all(), zero
    # IG's path points are computed from other float32 values on the shifted side: rounding, summed over steps
    assert (med[["deeplift", "deeplift-ablation", "gradient"]] < 1e-5).all() and med["integrated-gradients"] < 1e-3, med
    assert med["gradient"] == zero["gradient"]  # no reference: untouched by the option
    with pytest.raises(AuditError, match="reference"):
        input_invariance(model, x, y, ["deeplift"], reference="mean")


def test_a_per_channel_shift_moves_the_reference_per_channel():
    model = _conv_net()
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 2])
    med = input_invariance(model, x, y, ["deeplift", "integrated-gradients"], shift=[-0.5, 0.2, 1.0], progress=False,
                           reference="shifted").groupby("method").relative_l2.median()
    assert med["deeplift"] < 1e-5 and med["integrated-gradients"] < 1e-3, med


def _conv_net(padding_mode: str = "zeros", channels: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1, padding_mode=padding_mode), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding="same"), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3)).eval()


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect"])
def test_per_channel_shift_is_compensated_exactly(padding_mode):
    model = _conv_net(padding_mode)
    x = torch.rand(2, 3, 8, 8)
    shift = [-1.0, 0.5, 2.0]
    shifted = shifted_model(model, x, shift)
    moved = x + torch.tensor(shift).reshape(1, 3, 1, 1)
    torch.testing.assert_close(shifted(moved), model(x), rtol=0, atol=1e-5)
    df = input_invariance(model, x, torch.tensor([0, 2]), ["gradient"], shift=shift, progress=False)
    assert (df.relative_l2 < 1e-5).all()


def test_dense_first_layer_and_refusals():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 2)).eval()
    x = torch.rand(3, 1, 4, 4)
    torch.testing.assert_close(shifted_model(mlp, x, -1.0)(x - 1.0), mlp(x), rtol=0, atol=1e-5)
    with pytest.raises(AuditError, match="reaches 0"):
        shifted_model(nn.Sequential(nn.Tanh(), nn.Flatten(), nn.Linear(16, 2)), x)
    with pytest.raises(AuditError, match="one number or one per input channel"):
        shifted_model(_conv_net(), torch.rand(1, 3, 8, 8), [1.0, 2.0])
