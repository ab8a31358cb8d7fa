"""Attention rollout, generic attention explainability and attention Grad-CAM against their formulas written
out on attention weights (and their gradients) read from the model by plain PyTorch hooks."""
import importlib.util
import os

import pytest
import torch
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError
from audit.models import build


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = self.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """Patches of 2 x 2 on 8 x 8 images: a 4 x 4 grid, a class token, ``depth`` blocks, the class token's head."""

    def __init__(self, depth: int = 3, dim: int = 8, heads: int = 2, class_token: bool = True):
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 2, stride=2)
        self.cls = nn.Parameter(torch.randn(1, 1, dim)) if class_token else None
        self.pos = nn.Parameter(torch.randn(1, 16 + int(class_token), dim) * 0.5)
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 5)

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        if self.cls is not None:
            tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1)
        h = tokens + self.pos
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return self.head(h[:, 0] if self.cls is not None else h.mean(1))


def _model(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    model = TinyViT(**kwargs).double().eval()
    with torch.no_grad():  # sharper attention than at initialisation, so that the maps have structure
        for block in model.blocks:
            block.qkv.weight.mul_(3.0)
    return model


X = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
TARGET = torch.tensor([1, 4, 0])


def _attention(model: nn.Module, x: torch.Tensor, target: torch.Tensor | None = None):
    """Each block's attention weights (B, heads, T, T), and with ``target`` their gradients of the target logits."""
    kept = []

    def keep(module, inputs, output):
        if output.requires_grad:
            output.retain_grad()
        kept.append(output)

    handles = [block.softmax.register_forward_hook(keep) for block in model.blocks]
    with torch.set_grad_enabled(target is not None):
        out = model(x)
        if target is not None:
            out.gather(1, target[:, None]).sum().backward()
    for h in handles:
        h.remove()
    return [a.detach() for a in kept], [a.grad for a in kept] if target is not None else None


def _upsample(patches: torch.Tensor) -> torch.Tensor:
    """(B, 16) patch scores -> (B, 1, 8, 8) bilinear, the map's form."""
    return torch.nn.functional.interpolate(patches.reshape(-1, 1, 4, 4), size=(8, 8), mode="bilinear")


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rollout_is_the_product_of_the_normalised_matrices(fusion):
    model = _model()
    weights, _ = _attention(model, X)
    joint = torch.eye(17, dtype=torch.float64).expand(3, 17, 17)
    for a in weights:
        fused = {"mean": a.mean(1), "max": a.amax(1), "min": a.amin(1)}[fusion] + torch.eye(17, dtype=torch.float64)
        joint = torch.bmm(fused / fused.sum(-1, keepdim=True), joint)
    expected = _upsample(joint[:, 0, 1:])
    ours = Explainer(model, "attention-rollout", head_fusion=fusion).attribute(X, target=TARGET)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    # class-agnostic: another target gives the same map
    assert torch.equal(ours, Explainer(model, "attention-rollout", head_fusion=fusion).attribute(X, target=2))


def test_rollout_discards_the_lowest_weights_but_the_class_tokens_own():
    model = _model()
    weights, _ = _attention(model, X)
    joint = torch.eye(17, dtype=torch.float64).expand(3, 17, 17)
    for a in weights:
        fused = a.mean(1).reshape(3, -1).clone()
        keep = fused[:, 0].clone()
        low = fused.argsort(1)[:, : int(17 * 17 * 0.6)]
        fused.scatter_(1, low, 0.0)
        fused[:, 0] = keep
        fused = fused.reshape(3, 17, 17) + torch.eye(17, dtype=torch.float64)
        joint = torch.bmm(fused / fused.sum(-1, keepdim=True), joint)
    ours = Explainer(model, "attention-rollout", discard_ratio=0.6).attribute(X, target=0)
    torch.testing.assert_close(ours, _upsample(joint[:, 0, 1:]), rtol=1e-10, atol=1e-12)


def test_generic_attention_is_its_two_rules_written_out():
    """Chefer et al. 2021 (ICCV): A-bar = mean_h[(grad A * A)+]; R <- R + A-bar R from R = I, block by block."""
    model = _model()
    weights, grads = _attention(model, X, TARGET)
    r = torch.eye(17, dtype=torch.float64).expand(3, 17, 17)
    for a, g in zip(weights, grads):
        r = r + torch.bmm((g * a).clamp(min=0).mean(1), r)
    expected = _upsample(r[:, 0, 1:])
    ours = Explainer(model, "generic-attention").attribute(X, target=TARGET)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    both = Explainer(model, "generic-attention").maps_for_targets(X, [TARGET, 3])
    torch.testing.assert_close(both[0], ours, rtol=1e-12, atol=1e-15)  # K targets batched: rounding only
    assert not torch.allclose(both[1], ours)  # class-sensitive, unlike rollout


def test_attention_grad_cam_is_chefers_baseline_written_out():
    model = _model()
    weights, grads = _attention(model, X, TARGET)
    a, g = weights[-1][:, :, 0, 1:], grads[-1][:, :, 0, 1:]  # (B, heads, 16): the class token's row
    expected = _upsample((a * g.mean(-1, keepdim=True)).mean(1).clamp(min=0))
    ours = Explainer(model, "attention-grad-cam").attribute(X, target=TARGET)
    assert float(expected.abs().max()) > 0
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_transformer_attribution_is_chefers_rollout_of_gradient_times_relevance():
    """Chefer et al. 2021 (CVPR): C <- (I + mean_h[(grad A * R_A)+]) C from C = I; the gradients from hooks, the
    relevance R_A at each block's weights from the chefer-lrp chain."""
    model = _model()
    weights, grads = _attention(model, X, TARGET)
    lrp = Explainer(model, "chefer-lrp")
    forward = lrp.forward_pass(X, reference=False)
    nodes = [n for n in lrp.layers if lrp.graph.by_name[n].kind == "softmax"]
    onehot = torch.zeros(1, 3, 5, dtype=torch.float64).scatter_(2, TARGET[None, :, None], 1.0)
    relevance = forward.signals(lrp.graph.output, onehot, keep=set(nodes))
    c = torch.eye(17, dtype=torch.float64).expand(3, 17, 17)
    for node, g in zip(nodes, grads):
        c = torch.bmm(torch.eye(17, dtype=torch.float64) + (g * relevance[node][0]).clamp(min=0).mean(1), c)
    expected = _upsample(c[:, 0, 1:])
    ours = Explainer(model, "transformer-attribution").attribute(X, target=TARGET)
    assert float((expected - expected.amin()).abs().max()) > 0
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)


def test_cp_lrp_holds_attention_constant_and_attnlrp_sends_relevance_through_it():
    model = _model()
    relevance = {}
    for method in ("cp-lrp", "attnlrp"):
        ex = Explainer(model, method)
        forward = ex.forward_pass(X, reference=False)
        nodes = [n for n in ex.layers if ex.graph.by_name[n].kind == "softmax"]
        start = forward.values[ex.graph.output].gather(1, TARGET[:, None])
        onehot = torch.zeros(1, 3, 5, dtype=torch.float64).scatter_(2, TARGET[None, :, None], start[None])
        taps = forward.signals(ex.graph.output, onehot, keep=set(nodes) | {"input"})
        relevance[method] = [float(taps[n].abs().sum()) if n in taps else 0.0 for n in nodes]
        torch.testing.assert_close(taps["input"][0], ex.attribute(X, target=TARGET))
    assert relevance["cp-lrp"] == [0.0, 0.0, 0.0]  # the weights are constants: nothing reaches them
    assert all(r > 0 for r in relevance["attnlrp"])
    cp = Explainer(model, "cp-lrp", epsilon=1e-12).attribute(X, target=TARGET)
    # lrp-epsilon's rules, named, in factor form (the epsilon-free limit)
    torch.testing.assert_close(cp, Explainer(model, "lrp-epsilon", epsilon=1e-12).attribute(X, target=TARGET),
                               rtol=1e-8, atol=1e-10 * float(cp.abs().max()))
    assert not torch.allclose(cp, Explainer(model, "attnlrp").attribute(X, target=TARGET))


def test_without_a_class_token_the_mean_row_is_read():
    model = _model(class_token=False)
    weights, _ = _attention(model, X)
    joint = torch.eye(16, dtype=torch.float64).expand(3, 16, 16)
    for a in weights:
        fused = a.mean(1) + torch.eye(16, dtype=torch.float64)
        joint = torch.bmm(fused / fused.sum(-1, keepdim=True), joint)
    ours = Explainer(model, "attention-rollout").attribute(X, target=0)
    torch.testing.assert_close(ours, _upsample(joint.mean(1)), rtol=1e-10, atol=1e-12)


def test_vit_grad_cam_weighs_the_last_blocks_first_norm_on_the_patch_grid():
    model = _model()
    kept = {}

    def keep(module, inputs, output):
        output.retain_grad()
        kept["tokens"] = output

    handle = model.blocks[-1].norm1.register_forward_hook(keep)
    model(X).gather(1, TARGET[:, None]).sum().backward()
    handle.remove()
    tokens, grad = kept["tokens"].detach()[:, 1:], kept["tokens"].grad[:, 1:]  # (B, 16, D)
    cam = (grad.mean(1, keepdim=True) * tokens).sum(-1).clamp(min=0)
    ex = Explainer(model, "vit-grad-cam")
    torch.testing.assert_close(ex.attribute(X, target=TARGET), _upsample(cam), rtol=1e-10, atol=1e-12)
    assert ex.method.engine.layer_of(ex, X) == "blocks.2.norm1"


def test_the_shipped_vit_and_refusals():
    model = build("vit").eval()
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for method in ("attention-rollout", "generic-attention", "attention-grad-cam", "vit-grad-cam"):
        maps = Explainer(model, method).attribute(x, target=1)
        assert maps.shape == x.shape and torch.isfinite(maps).all(), method
    cnn = build("cnn").eval()
    with pytest.raises(AttributionError, match="no attention layer"):
        Explainer(cnn, "attention-rollout").attribute(x, target=0)
    with pytest.raises(AttributionError, match="discard_ratio"):
        Explainer(model, "attention-rollout", discard_ratio=1.0)
    with pytest.raises(AttributionError, match="head fusion"):
        Explainer(model, "attention-rollout", head_fusion="median")
    with pytest.raises(AttributionError, match="not tokens"):
        Explainer(model, "vit-grad-cam", layer="patch").attribute(x, target=0)


class _WindowBlock(_Block):
    """Attention within windows of ``window`` tokens: (B * windows, heads, window, window), as Swin and MaxViT."""

    window = 4

    def forward(self, x):
        b, t, d = x.shape
        return super().forward(x.reshape(b * t // self.window, self.window, d)).reshape(b, t, d)


def test_windowed_attention_is_refused_before_any_map_naming_the_windows():
    model = _model(class_token=False)
    model.blocks[1].__class__ = _WindowBlock
    for method in ("attention-rollout", "generic-attention", "transformer-attribution", "attention-grad-cam"):
        ex = Explainer(model, method)
        assert "within 4 windows of each image" in ex.method.engine.fits(ex, X), method
        with pytest.raises(AttributionError, match=r"'blocks\.1\..*' attends within 4 windows.*Swin, MaxViT"):
            ex.attribute(X, target=TARGET)


def test_attention_grad_cam_reads_the_patch_rows_where_the_head_never_reads_the_class_token():
    """A timm ViT with a class token but a mean-pooled head: the class token's row of the last attention gets no
    gradient, so reading it gave an all-zero map; the patch tokens' rows, which the head reads, stand in."""
    if importlib.util.find_spec("timm") is None:
        if os.environ.get("MODEL_LIBRARIES") == "required":
            pytest.fail("timm missing with MODEL_LIBRARIES=required (make test installs it into .venv-libraries)")
        pytest.skip("timm not installed here (make test runs this in .venv-libraries)")
    import timm

    from attributions.cam import target_signals
    from tests.model_libraries import perturb

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=64, global_pool="avg", num_classes=4).eval()
    perturb(model)
    x = torch.randn(2, 3, 64, 64)
    ex = Explainer(model, "attention-grad-cam")
    maps = ex.attribute(x, target=1)
    _, (nodes, _) = ex.method.engine._attention.get(ex, x)
    _, grads = target_signals(ex, x, [torch.tensor([1, 1])], {nodes[-1]})
    assert not grads[nodes[-1]][..., 0, :].any() and grads[nodes[-1]].any()  # the class token's row is never read
    assert torch.isfinite(maps).all() and maps.abs().amax((1, 2, 3)).min() > 0
