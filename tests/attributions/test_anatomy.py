"""Where things are in a traced model: feature maps followed through layouts, attention weights, tokens."""
import pytest
import torch
from torch import nn

from attributions import Explainer
from attributions.anatomy import attention_nodes, feature_maps, token_layout
from attributions.errors import AttributionError
from attributions.graph import trace
from tests.attributions.test_attention_maps import TinyViT


class _ChannelsLast(nn.Module):
    """conv -> permute to channels-last -> LayerNorm and a linear layer over channels -> permute back -> add, then
    an attention-like stretch of 4-D tensors (heads x tokens) that no feature map may be taken from."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.LayerNorm(4)
        self.mix = nn.Linear(4, 4)
        self.qk = nn.Linear(4, 8)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.conv(x)
        block = self.mix(self.norm(h.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        h = h + block
        tokens = h.flatten(2).transpose(1, 2)  # (B, T, C)
        q = self.qk(tokens).reshape(x.shape[0], -1, 2, 4).permute(0, 2, 1, 3)  # (B, heads, T, d)
        scores = (q @ q.transpose(-1, -2)) * 0.5
        mixed = (scores.softmax(-1) @ q).mean(1)  # (B, T, d)
        return self.head(mixed.mean(1))


def _traced(module_class, size):
    """(model, two seeded images of ``size`` px, its graph, the gradient's forward values) of a fresh ``module_class``."""
    torch.manual_seed(0)
    model = module_class().double().eval()
    x = torch.rand(2, 1, size, size, dtype=torch.float64)
    graph = trace(model, x)
    return model, x, graph, Explainer(model, "gradient", graph=graph).forward_pass(x, reference=False).values


def test_feature_maps_follow_layouts_through_permutes_and_stop_at_tokens():
    model, x, graph, values = _traced(_ChannelsLast, 6)
    maps = feature_maps(graph, values, x.ndim)
    # the block's permute back to channels-first and its sum count; the channels-last stretch and attention do not
    assert maps == ["conv", "permute#1", "add"], maps
    ex = Explainer(model, "grad-cam", graph=graph)
    assert ex.method.engine.layer_of(ex, x) == "add"


class _UnreadPooler(nn.Module):
    """A model that also returns a pooling of its last map that the logits never read (Hugging Face's TextNet
    returns a pooler output beside the classifier's own pooling): the explained output is the tuple's first."""

    def __init__(self):
        super().__init__()
        self.conv, self.pooler, self.pool, self.fc = nn.Conv2d(1, 4, 3), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return self.fc(self.pool(h).flatten(1)), self.pooler(h)


def test_a_feature_map_the_logits_do_not_depend_on_is_never_the_layer():
    model, x, graph, values = _traced(_UnreadPooler, 8)
    assert "pooler" in graph.by_name and "pooler" not in feature_maps(graph, values, x.ndim)
    ex = Explainer(model, "grad-cam", graph=graph)
    assert ex.method.engine.layer_of(ex, x) == "relu" and ex.attribute(x, target=0).shape == x.shape
    with pytest.raises(AttributionError, match="that the logits depend on"):
        Explainer(model, "grad-cam", layer="pooler").attribute(x, target=0)


def test_attention_nodes_and_the_token_layout_of_a_vit():
    torch.manual_seed(0)
    model = TinyViT(depth=2).double().eval()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    graph = trace(model, x)
    values = Explainer(model, "gradient", graph=graph).forward_pass(x, reference=False).values
    nodes = attention_nodes(graph, values)
    assert [graph.by_name[n].path for n in nodes] == ["blocks.0.softmax", "blocks.1.softmax"]
    layout = token_layout(graph, values, 17, x.ndim)
    assert (layout.prefix, layout.grid) == (1, (4, 4))
    with pytest.raises(AttributionError, match="do not match the patch grid"):
        token_layout(graph, values, 10, x.ndim)  # fewer tokens than patches: windows, not the grid
    assert feature_maps(graph, values, x.ndim) == ["patch"]  # the tokens end the feature maps
