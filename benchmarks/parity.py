"""Parity with the reference implementations, measured on the shipped checkpoints.

For each method with a reference that runs here, the largest |ours - reference| over the largest |reference|
(relative max error) on the embedded sample's images, in float64: captum's Saliency, GuidedBackprop,
Deconvolution, DeepLift, IntegratedGradients, NoiseTunnel(IntegratedGradients) (same seed, same noise),
LayerGradCam with LayerAttribution.interpolate (ReLU on and off, nearest and bilinear) and GuidedGradCam, on
the default Grad-CAM layer; pytorch-grad-cam's GradCAM (package ``grad-cam``) on torchvision's ResNet-18 after
its own normalisation (absolute error); and the SSIM against scikit-image's ``structural_similarity``
(absolute error). The tests assert these to their tolerances on small models; this prints the numbers.

    python -m benchmarks.parity [--models cnn-sgd,vgg-sgd,resnet-sgd] [--images 8]

pytorch-grad-cam needs torchvision: run it in ``.venv-libraries`` (``make test`` builds it), or its rows say
why they are missing.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

from attributions import Explainer


def relative(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|; NaN where the reference is all zero (a comparison that checks nothing)."""
    scale = float(ref.detach().abs().max())
    return float((ours.detach() - ref.detach()).abs().max()) / scale if scale > 0 else float("nan")


# a reference implementation as f(x, target)
Reference = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def captum_pairs(model: torch.nn.Module, layer: str) -> list[tuple[str, dict[str, Any], Reference]]:
    """(our method, its parameters, the reference as f(x, target)) for captum's implementations."""
    from captum.attr import (
        Deconvolution,
        DeepLift,
        GuidedBackprop,
        GuidedGradCam,
        IntegratedGradients,
        LayerAttribution,
        LayerGradCam,
        NoiseTunnel,
        Saliency,
    )

    module = model.get_submodule(layer)

    def cam(relu: bool, mode: str) -> Reference:
        def ref(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            maps = LayerGradCam(model, module).attribute(x, target=t, relu_attributions=relu)
            upsampled: torch.Tensor = LayerAttribution.interpolate(maps, tuple(x.shape[2:]), interpolate_mode=mode)
            return upsampled.expand_as(x)
        return ref

    def noise_tunnel(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(7)
        sigma = 0.2 * float(x.max() - x.min())
        maps: torch.Tensor = NoiseTunnel(IntegratedGradients(model)).attribute(x, nt_type="smoothgrad", nt_samples=5,
                                                                               stdevs=sigma, target=t, n_steps=8)
        return maps

    pairs: list[tuple[str, dict[str, Any], Reference]] = [
        ("gradient", {}, lambda x, t: Saliency(model).attribute(x, target=t, abs=False)),
        ("guided-backprop", {}, lambda x, t: GuidedBackprop(model).attribute(x, target=t)),
        ("deconvnet", {}, lambda x, t: Deconvolution(model).attribute(x, target=t)),
        ("deeplift", {}, lambda x, t: DeepLift(model).attribute(x, target=t)),
        ("integrated-gradients", {"n_steps": 16}, lambda x, t: IntegratedGradients(model).attribute(x, target=t,
                                                                                                   n_steps=16)),
        ("smoothgrad-ig", {"samples": 5, "n_steps": 8, "noise": 0.2}, noise_tunnel),
        ("guided-grad-cam", {"layer": layer, "upsample": "nearest"},
         lambda x, t: GuidedGradCam(model, module).attribute(x, target=t)),
    ]
    pairs += [("grad-cam", {"layer": layer, "relu": relu, "upsample": mode}, cam(relu, mode))
              for relu in (True, False) for mode in ("nearest", "bilinear")]
    return pairs


def shipped_rows(names: list[str], images: int) -> list[dict[str, Any]]:
    """One row per shipped model x method x reference setting."""
    from audit import embedded_sample, load_checkpoint

    sample, labels = embedded_sample()
    x = torch.from_numpy(sample[:: max(1, len(sample) // images)][:images]).double()
    t = torch.from_numpy(labels[:: max(1, len(labels) // images)][:images]).long()
    rows = []
    for name in names:
        model = load_checkpoint(name).double().eval()
        cam = Explainer(model, "grad-cam")
        layer = cam.method.engine.conventions(cam, x)["module"]  # the default layer, as a run's manifest names it
        for method, params, reference in captum_pairs(model, layer):
            if method == "smoothgrad-ig":
                torch.manual_seed(7)
            ours = Explainer(model, method, **params).attribute(x, target=t)
            ref = reference(x, t)
            setting = ", ".join(f"{k}={v}" for k, v in params.items() if k != "layer")
            rows.append({"model": name, "method": method, "reference": "captum", "setting": setting,
                         "layer": params.get("layer", ""), "error": relative(ours, ref), "measure": "relative max"})
    return rows


def grad_cam_package_rows() -> list[dict[str, Any]]:
    """pytorch-grad-cam's GradCAM on a perturbed torchvision ResNet-18 (layer4): its ReLU, min-max, OpenCV's
    bilinear resize and second min-max; ours with upsample=bilinear, normalise=before, min-maxed once more."""
    base = {"model": "torchvision resnet18", "method": "grad-cam", "reference": "pytorch-grad-cam",
            "setting": "upsample=bilinear, normalise=before", "layer": "layer4", "measure": "absolute max"}
    try:
        import torchvision
        from pytorch_grad_cam import GradCAM
        from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    except ImportError as exc:
        return [base | {"error": float("nan"), "setting": f"not run: {exc}"}]
    from tests.model_libraries import perturb

    torch.manual_seed(0)
    model = perturb(torchvision.models.resnet18().eval(), 0)
    x = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    targets = [3, 7]
    with GradCAM(model=model, target_layers=[model.layer4]) as cam:
        ref = torch.from_numpy(cam(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets]))
    ours = Explainer(model, "grad-cam", layer="layer4", upsample="bilinear", normalise="before").attribute(
        x, target=torch.tensor(targets))[:, 0]
    low = ours.amin((1, 2), keepdim=True)
    ours = (ours - low) / (ours.amax((1, 2), keepdim=True) - low)
    return [base | {"error": float((ours - ref).abs().max())}]


def ssim_rows() -> list[dict[str, Any]]:
    """Our SSIM against scikit-image's on seeded image pairs, for the windows the audit offers."""
    from skimage.metrics import structural_similarity

    from audit.measures.similarity import ssim

    g = torch.Generator().manual_seed(0)
    a = torch.rand(8, 28, 28, generator=g, dtype=torch.float64)
    b = (a + 0.4 * torch.rand(8, 28, 28, generator=g, dtype=torch.float64)).clamp(0, 1)
    rows = []
    # (our keywords, scikit-image's): the lists' dicts have no common type mypy would infer
    settings: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"win_size": 5}, {"win_size": 5}), ({"win_size": 7}, {"win_size": 7}),
        ({"gaussian": True}, {"gaussian_weights": True, "sigma": 1.5})]
    for ours, theirs in settings:
        got = ssim(a, b, data_range=1.0, **ours).numpy()
        want = np.array([structural_similarity(p.numpy(), q.numpy(), data_range=1.0, **theirs)  # type: ignore[no-untyped-call]
                         for p, q in zip(a, b)])
        rows.append({"model": "28x28 image pairs", "method": "ssim", "reference": "scikit-image",
                     "setting": ", ".join(f"{k}={v}" for k, v in ours.items()), "layer": "",
                     "error": float(np.abs(got - want).max()), "measure": "absolute max"})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn-sgd,vgg-sgd,resnet-sgd", help="shipped checkpoints")
    parser.add_argument("--images", type=int, default=8, help="images of the embedded sample")
    args = parser.parse_args(argv)
    rows = shipped_rows(args.models.split(","), args.images) + grad_cam_package_rows() + ssim_rows()
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.1e}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
