"""Grad-CAM and Guided Grad-CAM: captum's LayerGradCam / GuidedGradCam and pytorch-grad-cam as references,
the default layer on real model families, the conventions, and bad layers refused."""
import os

import pytest
import torch
from captum.attr import GuidedGradCam, LayerAttribution, LayerGradCam
from torch import nn

from attributions import Explainer
from attributions.errors import AttributionError
from audit.models import build
from tests.engine_models import ResidualNet, randomize_batchnorm, set_biases


def _models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x28 = torch.rand(3, 1, 28, 28, generator=gen, dtype=torch.float64)
    x8 = torch.rand(3, 1, 8, 8, generator=gen, dtype=torch.float64)
    return {"cnn": (build("cnn").double().eval(), x28),
            "resnet": (randomize_batchnorm(build("resnet"), gen).double().eval(), x28),
            "residual": (set_biases(ResidualNet(), -0.3, 0.3).double().eval(), x8)}


MODELS = _models()


def _close(ours: torch.Tensor, ref: torch.Tensor, tolerance: float = 1e-6) -> None:
    ref = ref.detach()
    assert float(ref.abs().max()) > 0, "a zero reference map checks nothing"
    assert float((ours - ref).abs().max()) <= tolerance * float(ref.abs().max())


# (model, our layer as a module path, the module captum hooks)
LAYERS = [("cnn", "features.7", lambda m: m.features[7]), ("resnet", "layer2", lambda m: m.layer2),
          ("resnet", "layer3.2", lambda m: m.layer3[2]), ("residual", "r2", lambda m: m.r2),
          ("residual", "c1", lambda m: m.c1)]


@pytest.mark.parametrize("name,layer,module", LAYERS)
@pytest.mark.parametrize("upsample", ["nearest", "bilinear"])
@pytest.mark.parametrize("relu", [True, False])
def test_grad_cam_matches_captum_layer_grad_cam(name, layer, module, upsample, relu):
    model, x = MODELS[name]
    target = torch.tensor([0, 2, 1])
    ours = Explainer(model, "grad-cam", layer=layer, upsample=upsample, relu=relu).attribute(x, target=target)
    cam = LayerGradCam(model, module(model)).attribute(x, target=target, relu_attributions=relu)
    ref = LayerAttribution.interpolate(cam, tuple(x.shape[2:]), interpolate_mode=upsample)
    assert ours.shape == x.shape
    _close(ours, ref.expand_as(x))


@pytest.mark.parametrize("name,layer,module", LAYERS[:3])
def test_guided_grad_cam_matches_captum(name, layer, module):
    model, x = MODELS[name]
    ours = Explainer(model, "guided-grad-cam", layer=layer, upsample="nearest").attribute(x, target=1)
    _close(ours, GuidedGradCam(model, module(model)).attribute(x, target=1))


def test_default_layer_is_the_last_feature_map_before_global_pooling():
    model, x = MODELS["resnet"]
    ex = Explainer(model, "grad-cam")
    ex.attribute(x, target=0)
    assert ex.method.engine.layer_of(ex, x) == "layer3.2.relu2"  # then the global average pool
    cnn, x28 = MODELS["cnn"]
    ex = Explainer(cnn, "grad-cam")
    ours = ex.attribute(x28, target=0)
    layer = ex.method.engine.layer_of(ex, x28)
    module = cnn.get_submodule(layer)  # the last pooling layer before the flatten: a 7 x 7 map
    ref = LayerAttribution.interpolate(LayerGradCam(cnn, module).attribute(x28, target=0, relu_attributions=True),
                                       (28, 28), interpolate_mode="bilinear")
    _close(ours, ref.expand_as(x28))


def test_conventions_normalise_before_and_after_upsampling():
    model, x = MODELS["resnet"]
    raw = Explainer(model, "grad-cam", upsample="bilinear", layer="layer2").attribute(x, target=1)[:, :1]
    after = Explainer(model, "grad-cam", upsample="bilinear", layer="layer2", normalise="after").attribute(x, target=1)
    low = raw.amin((2, 3), keepdim=True)
    _close(after[:, :1], (raw - low) / (raw.amax((2, 3), keepdim=True) - low))
    before = Explainer(model, "grad-cam", upsample="nearest", layer="layer2", normalise="before").attribute(x, target=1)
    # nearest upsampling only repeats values, so min-max before it equals min-max after it
    near = Explainer(model, "grad-cam", upsample="nearest", layer="layer2", normalise="after").attribute(x, target=1)
    _close(before, near)
    assert float(before.amin()) == 0.0 and float(before.amax()) == 1.0


def test_several_targets_and_memory_chunks_give_the_single_target_maps(monkeypatch):
    from attributions import memory

    model, x = MODELS["resnet"]
    ex = Explainer(model, "grad-cam", layer="layer2")
    both = ex.maps_for_targets(x, [0, torch.tensor([2, 1, 0])])
    _close(both[0], ex.attribute(x, target=0))
    _close(both[1], ex.attribute(x, target=torch.tensor([2, 1, 0])))
    monkeypatch.setattr(memory, "fitting", lambda n, *args, **kwargs: 1)  # one image at a time
    _close(Explainer(model, "grad-cam", layer="layer2").attribute(x, target=0), both[0])


def test_bad_layers_and_conventions_are_refused_clearly():
    model, x = MODELS["resnet"]
    with pytest.raises(AttributionError, match="neither a node nor a module.*layer1"):
        Explainer(model, "grad-cam", layer="layer9").attribute(x, target=0)
    with pytest.raises(AttributionError, match="not a channels-first feature map.*layer3.2.relu2"):
        Explainer(model, "grad-cam", layer="fc").attribute(x, target=0)
    with pytest.raises(AttributionError, match="upsample must be one of nearest, bilinear"):
        Explainer(model, "grad-cam", upsample="bicubic")
    with pytest.raises(AttributionError, match="normalise"):
        Explainer(model, "grad-cam", normalise="zscore")
    flat = nn.Sequential(nn.Linear(4, 3)).double()
    with pytest.raises(AttributionError, match="spatial axes"):
        Explainer(flat, "grad-cam").attribute(torch.rand(2, 4, dtype=torch.float64), target=0)


class _FoldedPatches(nn.Module):
    """A stem, then a convolution over 2 x 2 patches folded into the batch axis (as MobileViT's and MViT's local
    blocks fold them): the automatic layer, the last feature map, holds 4 rows per input."""

    def __init__(self):
        super().__init__()
        self.stem, self.local, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 5)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        b, c, height, width = h.shape
        patches = h.reshape(b, c, 2, height // 2, 2, width // 2).permute(0, 2, 4, 1, 3, 5)
        t = torch.relu(self.local(patches.reshape(b * 4, c, height // 2, width // 2)))
        return self.head(t.mean((2, 3)).reshape(b, 4, c).mean(1))


@pytest.mark.parametrize("method", ["grad-cam", "guided-grad-cam"])
def test_the_automatic_layer_keeps_the_batch_axis_and_a_folding_one_is_refused(method):
    """The last feature map folds 4 patches into the batch axis: the automatic layer is the last one that keeps it
    (the stem's ReLU), a map per input; the folding layer, asked for, is refused with the layers that keep it."""
    torch.manual_seed(0)
    model, x = _FoldedPatches().eval(), torch.rand(2, 3, 8, 8)
    explainer = Explainer(model, method)
    assert explainer.attribute(x, target=1).shape == x.shape
    assert explainer.method.engine.layer_of(explainer, x) == "relu"
    with pytest.raises(AttributionError, match=r"'local' .* keeps the inputs' batch axis and that the logits depend on; "
                                               r"choose one of .*: stem, relu"):
        Explainer(model, method, layer="local").attribute(x, target=1)


def test_the_model_is_left_untouched():
    model, x = MODELS["resnet"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    Explainer(model, "guided-grad-cam").attribute(x, target=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())


def _grad_cam_package():
    try:
        import pytorch_grad_cam
    except ImportError as exc:
        if os.environ.get("MODEL_LIBRARIES") == "required":
            pytest.fail(f"pytorch-grad-cam is not installed ({exc}); make test installs it into .venv-libraries")
        pytest.skip("pytorch-grad-cam is not installed here (make test runs this file in .venv-libraries)")
    return pytorch_grad_cam


@pytest.mark.parametrize("architecture", ["resnet18", "convnext_tiny"])
def test_grad_cam_matches_pytorch_grad_cam_on_torchvision(architecture):
    """pytorch-grad-cam (the ``grad-cam`` package): ReLU, min-max per map, then OpenCV's bilinear resize, and a
    second min-max; ours with upsample=bilinear and normalise=before, min-maxed once more, on the same layer."""
    package = _grad_cam_package()
    import torchvision
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from tests.model_libraries import perturb

    torch.manual_seed(0)
    model = perturb(getattr(torchvision.models, architecture)().eval(), 0)
    module, layer = (model.layer4, "layer4") if architecture == "resnet18" else (model.features[7], "features.7")
    x = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    targets = [3, 7]
    with package.GradCAM(model=model, target_layers=[module]) as cam:
        ref = torch.from_numpy(cam(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets]))
    ours = Explainer(model, "grad-cam", layer=layer, upsample="bilinear", normalise="before").attribute(
        x, target=torch.tensor(targets))[:, 0]
    low = ours.amin((1, 2), keepdim=True)
    ours = (ours - low) / (ours.amax((1, 2), keepdim=True) - low)
    assert ref.shape == ours.shape
    assert float((ours - ref).abs().max()) < 1e-5


def test_vit_grad_cam_matches_pytorch_grad_cam_on_a_timm_vit():
    """pytorch-grad-cam's ViT recipe: the last block's norm1 tokens, class token dropped, reshaped to the patch
    grid; ours finds that layer and that grid by itself."""
    package = _grad_cam_package()
    import timm
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from tests.model_libraries import perturb

    model = perturb(timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=10).eval(), 0)

    def reshape(tokens):
        return tokens[:, 1:, :].reshape(tokens.shape[0], 4, 4, tokens.shape[2]).permute(0, 3, 1, 2)

    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    targets = [3, 7]
    with package.GradCAM(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=reshape) as cam:
        ref = torch.from_numpy(cam(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets]))
    ex = Explainer(model, "vit-grad-cam", normalise="before")
    ours = ex.attribute(x, target=torch.tensor(targets))[:, 0]
    assert ex.method.engine.conventions(ex, x)["module"] == "blocks.11.norm1"
    low = ours.amin((1, 2), keepdim=True)
    ours = (ours - low) / (ours.amax((1, 2), keepdim=True) - low)
    assert float((ours - ref).abs().max()) < 1e-5


def test_on_timm_mobilevit_and_mvitv2_the_maps_are_one_per_input_or_refused():
    """The issue's cases, random weights perturbed: MViTv2's Grad-CAM and Guided Grad-CAM take the last feature map
    that keeps the batch axis (its attention pooling folds the patches in), a map per input; MobileViT's last
    attention reads tokens folded into the batch axis: ViT Grad-CAM refuses, saying why and what to use instead;
    on MViTv2 it reads the last block's first norm."""
    timm = pytest.importorskip("timm")
    from tests.model_libraries import perturb

    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    mvit = perturb(timm.create_model("mvitv2_tiny", num_classes=10).eval(), 0)
    for method in ("grad-cam", "guided-grad-cam"):
        maps = Explainer(mvit, method).attribute(x, target=1)
        assert maps.shape == x.shape and bool(torch.isfinite(maps).all())
    # ViT Grad-CAM reads the last block's first norm (not a norm of its key pooling), its tokens on their pooled grid
    vit_cam = Explainer(mvit, "vit-grad-cam")
    maps = vit_cam.attribute(x, target=1)
    assert maps.shape == x.shape and bool(torch.isfinite(maps).all())
    assert vit_cam.method.engine.conventions(vit_cam, x)["module"] == "stages.3.blocks.1.norm1"
    mobilevit = perturb(timm.create_model("mobilevit_xxs", num_classes=10).eval(), 0)
    with pytest.raises(AttributionError, match="fold patches into the batch axis.*use grad-cam"):
        Explainer(mobilevit, "vit-grad-cam").attribute(x, target=1)
    assert Explainer(mobilevit, "grad-cam").attribute(x, target=1).shape == x.shape
