"""Copies of models that cache non-leaf tensors on themselves during a forward pass."""
import copy

import pytest
import torch
from torch import nn

from audit.checks.randomization import parameter_randomization
from audit.models.copying import copy_model


class CachingNet(nn.Module):
    """Caches, in eval mode, a bias computed from a parameter (as timm's EfficientViT-M and Hugging Face's LeViT
    do) and the last hidden activation as a bare tensor."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bias_table = nn.Parameter(torch.randn(4))
        self.head = nn.Linear(4, 3)
        self.cache: dict[str, torch.Tensor] = {}
        self.last = None

    def forward(self, x):
        if self.training or "bias" not in self.cache:
            bias = self.bias_table * 2.0
            if not self.training:
                self.cache["bias"] = bias
        else:
            bias = self.cache["bias"]
        h = torch.relu(self.conv(x) + bias[None, :, None, None])
        self.last = h
        return self.head(h.mean((2, 3)))


def test_a_model_caching_non_leaf_tensors_is_copied_and_randomized_without_touching_it():
    torch.manual_seed(0)
    model = CachingNet().eval()
    x = torch.randn(2, 1, 8, 8)
    model(x)
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(model)
    twin = copy_model(model)
    assert twin.cache == {} and not twin.last.requires_grad and "bias" in model.cache
    with torch.no_grad():
        twin.bias_table.add_(1.0)
    assert not torch.allclose(twin(x), model(x))  # the copy computes from its own parameters, not a stale cache
    before = {k: v.clone() for k, v in model.state_dict().items()}
    df = parameter_randomization(model, x, torch.tensor([0, 1]), ["gradient"], progress=False, granularity="layer")
    assert df.stage.max() >= 3 and df.ssim.notna().all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
