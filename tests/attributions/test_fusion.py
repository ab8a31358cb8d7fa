"""Attention fused into one op in a pass whose backward autograd computes (attributions.fusion)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from attributions import Explainer, fusion
from attributions.attention import Fused
from audit.models import load_checkpoint
from tests.engine_models import MaskedAttention


def _vit() -> nn.Module:
    return load_checkpoint("vit-sgd").double()


# the shipped ViT (50 tokens, heads of width 16); masked attention with two heads of 3 channels over 8 tokens,
# long enough to fuse
MODELS = {"vit": (_vit, (3, 1, 28, 28)),
          **{f"{kind} mask": (lambda b=b: MaskedAttention(b, tokens=8, width=3, heads=2).double().eval(), (3, 8, 4))
             for kind, b in (("float", False), ("boolean", True))}}


def _maps(model: nn.Module, method: str, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the maps of class 1, the attentions the pass ran fused)."""
    explainer = Explainer(model, method)
    out = explainer.attribute(x, target=1)
    return out, sum(len(lean.fused) for lean in explainer._plans.values())


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("method", ["gradient", "attnlrp", "guided-backprop"])
def test_fused_attention_gives_the_expanded_nodes_maps(name, method, monkeypatch):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape, dtype=torch.float64)
    fused, count = _maps(model, method, x)
    assert count == (4 if name == "vit" else 1)
    monkeypatch.setattr(fusion, "plan", lambda *args: {})
    expanded, none = _maps(model, method, x)
    assert none == 0 and expanded.abs().amax() > 0
    torch.testing.assert_close(fused, expanded, rtol=1e-10, atol=1e-12 * float(expanded.abs().amax()))


def test_which_attentions_fuse():
    model = _vit()
    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    plans = {}
    for method in ("gradient", "attnlrp", "cp-lrp", "deeplift", "lrp-epsilon"):
        explainer = Explainer(model, method)
        explainer.attribute(x, target=0)
        graph = explainer.traced
        plans[method] = fusion.plan(graph, explainer._rules, frozenset({"input", graph.output}))
    attentions = [n for n in graph.nodes if n.fused is not None]
    assert len(attentions) == 4 and set(plans["gradient"]) == set(plans["attnlrp"]) == {n.name for n in attentions}
    assert plans["attnlrp"][attentions[0].name].scales == (0.25, 0.25, 0.5)  # halves through both products
    assert plans["gradient"][attentions[0].name].scales == (1.0, 1.0, 1.0)
    # CP-LRP holds the weights; DeepLIFT and LRP-epsilon are not gradients through the attention
    assert plans["cp-lrp"] == plans["deeplift"] == plans["lrp-epsilon"] == {}
    # a node inside an attention whose signal is asked for keeps the attention expanded
    explainer = Explainer(model, "attnlrp")
    explainer.attribute(x, target=0)
    inner = attentions[0].fused.inner[-1]
    kept = fusion.plan(explainer.traced, explainer._rules, frozenset({"input", explainer.traced.output, inner}))
    assert attentions[0].name not in kept and len(kept) == 3


def test_the_fused_pass_keeps_less(monkeypatch):
    model = _vit()
    x = torch.rand(4, 1, 28, 28, dtype=torch.float64)
    saved = {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(fusion, "plan", lambda *args: {})
        explainer = Explainer(model, "attnlrp")
        explainer.attribute(x, target=0)
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            explainer.attribute(x, target=0)
        saved[fused] = sum(storages.values())
    # 4 blocks, 4 images, 4 heads of width 16 over 50 tokens: the weights (50 x 50) against an output and a
    # log-sum-exp (50 x 17), float64
    assert saved[False] - saved[True] >= 0.9 * 4 * 4 * 4 * 50 * (50 - 17) * 8


@pytest.mark.parametrize("tokens, width, fuses", [(197, 64, True), (65, 64, False), (66, 64, True), (None, 64, False)])
def test_fusion_needs_a_sequence_longer_than_the_heads_width(tokens, width, fuses):
    assert Fused((), lambda *a: None, tokens, width).holds_less is fuses
