"""Reconstruction by transposed weights (Bort's invertibility experiment)."""
import copy

import pytest
import torch
from torch import nn

from audit.models import build
from bort.errors import BortError
from bort.invert import reconstruct, reconstruction_quality


def test_orthogonal_conv_reconstructs_its_input_exactly():
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 25, 5, padding=2)
    q, _ = torch.linalg.qr(torch.randn(25, 25))
    conv.weight.data = 2.0 * q.reshape(25, 1, 5, 5)
    model = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(25 * 36, 3))
    x = torch.rand(2, 1, 12, 12)
    before = copy.deepcopy(model.state_dict())
    torch.testing.assert_close(reconstruct(model, x, "0"), x, atol=1e-5, rtol=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    ssim = reconstruction_quality(model, x, "0").ssim
    assert (ssim > 0.999).all()
    random_conv = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2))
    assert (reconstruction_quality(random_conv, x, "0").ssim < 0.99).all()


def test_reconstruct_rejects_branching_models_and_unknown_layers():

    with pytest.raises(BortError, match="no module named 'conv9'"):
        reconstruct(build("cnn"), torch.rand(1, 1, 28, 28), "conv9")
    with pytest.raises(BortError, match="plain chain"):
        reconstruct(build("resnet"), torch.rand(1, 1, 28, 28), "layer1.1.conv1")



def test_reconstruct_batchnorm_variants():
    torch.manual_seed(0)
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    plain = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, affine=False)).double().eval()
    plain[1].running_mean.uniform_()
    plain[1].running_var.uniform_(0.5, 2.0)
    # without affine parameters the BatchNorm's inverse is y * std + mean: the conv's output comes back
    with torch.no_grad():
        conv_out = plain[0](x)
    torch.testing.assert_close(reconstruct(plain[1:], conv_out, "1"), conv_out)
    untracked = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False)).eval()
    with pytest.raises(BortError, match="running statistics"):
        reconstruct(untracked, x.float(), "1")
