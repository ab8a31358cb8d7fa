"""Models named as the libraries name them (timm:, torchvision:, hf:), loaded offline and audited.

The tests that build a library's model need it installed: ``make test`` runs this file in
``.venv-libraries`` as well, with ``MODEL_LIBRARIES=required`` (a missing library then fails). In the main
venv those skip, and the errors for a missing library are checked instead.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from attributions.errors import ToolkitWarning
from audit.errors import ModelError
from audit.models.checkpoint import model_files, resolve_model
from audit.models.libraries import is_library_spec, load_library_model, read_state

REQUIRED = os.environ.get("MODEL_LIBRARIES") == "required"


def needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if REQUIRED:
            pytest.fail(f"{', '.join(missing)} missing with MODEL_LIBRARIES=required (make test installs them into "
                        ".venv-libraries)")
        pytest.skip(f"{', '.join(missing)} not installed here (make test runs this in .venv-libraries)")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_library_names_and_their_errors(tmp_path):
    assert is_library_spec("timm:convnext_tiny") and is_library_spec("hf:./folder")
    assert not is_library_spec("tiny:make") and not is_library_spec("cnn-sgd")
    with pytest.raises(ModelError, match="names no model; e.g. timm:convnext_tiny"):
        resolve_model("timm:")
    with pytest.raises(ModelError, match="--num-classes applies to timm:"):
        resolve_model("cnn-sgd", num_classes=3)
    for prefix, module in (("timm", "timm"), ("torchvision", "torchvision"), ("hf", "transformers")):
        if importlib.util.find_spec(module) is None:
            with pytest.raises(ModelError, match=f"need the {module} package.*pip install {module}"):
                resolve_model(f"{prefix}:anything")
    (tmp_path / "text.pt").write_text("not a state dict")
    with pytest.raises(ModelError, match="not a readable state_dict"):
        read_state(tmp_path / "text.pt")
    with pytest.raises(ModelError, match="weights file .* not found"):
        read_state(tmp_path / "absent.safetensors")


def test_timm_and_torchvision_models_take_their_weights_from_a_file(tmp_path):
    needs("timm", "torchvision", "safetensors")
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    trained = timm.create_model("resnet18", num_classes=4).eval()
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(tmp_path / "w.safetensors"))
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    for weights in (tmp_path / "w.safetensors", tmp_path / "w.pt"):
        model = resolve_model("timm:resnet18", str(weights), num_classes=4)
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(model(x), trained(x), rtol=0, atol=0)
        assert not model.training
        assert model.metadata["library"] == "timm" and model.metadata["library_version"] == timm.__version__
        assert model.metadata["weights"] == {str(weights): _sha(weights)}
        assert model_files("timm:resnet18", str(weights)) == [weights]
    with pytest.raises(ModelError, match="does not fit timm:resnet18.*--num-classes"):
        resolve_model("timm:resnet18", str(tmp_path / "w.pt"), num_classes=7)
    with pytest.raises(ModelError, match="timm has no model 'resnet_nope'"):
        resolve_model("timm:resnet_nope")
    with pytest.raises(ModelError, match="timm has no model 'resnet10'; the nearest: .*resnet10t"):
        resolve_model("timm:resnet10")
    model = resolve_model("torchvision:mobilenet_v3_small", num_classes=3)
    assert model.metadata["weights"] == "random initialisation" and model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    with pytest.raises(ModelError, match="torchvision has no model 'resnet5'; the nearest: resnet50"):
        resolve_model("torchvision:resnet5")


def _tiny_vit(folder, labels: int = 3):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=labels)
    model = ViTForImageClassification(config).eval()
    model.save_pretrained(folder)
    return model


def _image_folder(root, classes=("ant", "bee"), per_class=3):
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_a_saved_hugging_face_model_is_read_offline(tmp_path):
    needs("transformers")
    import transformers

    saved = _tiny_vit(tmp_path / "vit")
    model = load_library_model(f"hf:{tmp_path / 'vit'}")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, saved(x).logits, rtol=0, atol=0)
    weights = next((tmp_path / "vit").glob("*.safetensors"))
    assert model.metadata["library_version"] == transformers.__version__
    assert model.metadata["weights"] == {str(weights): _sha(weights)}
    assert model_files(f"hf:{tmp_path / 'vit'}") == [weights]
    with pytest.raises(ModelError, match="no such folder, and no model of that id in the Hugging Face cache"):
        load_library_model(f"hf:{tmp_path / 'absent'}")


@pytest.mark.slow
@pytest.mark.parametrize("library", ["hf", "timm"])
def test_the_command_line_audits_a_library_model(tmp_path, library):
    """``audit run --models hf:FOLDER`` / ``timm:NAME --num-classes --weights``, on an image folder: the run
    completes and its manifest records the library, its version and the weights' sha256."""
    needs("transformers" if library == "hf" else "timm")
    from audit.cli import main

    images = _image_folder(tmp_path / "imgs")
    if library == "hf":
        _tiny_vit(tmp_path / "vit", labels=2)
        spec, extra = f"hf:{tmp_path / 'vit'}", []
        weights = next((tmp_path / "vit").glob("*.safetensors"))
    else:
        import timm
        from safetensors.torch import save_file

        torch.manual_seed(0)
        state = timm.create_model("resnet18", num_classes=2).state_dict()
        weights = tmp_path / "resnet18.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(weights))
        spec, extra = "timm:resnet18", ["--num-classes", "2", "--weights", str(weights)]
    out = tmp_path / "out"
    code = main(["run", "--models", spec, *extra, "--methods", "gradient,lrp-epsilon", "--tests", "random-logit,cascading",
                 "--data", "imagefolder", "--data-root", str(images), "--n-images", "4", "--out", str(out), "--quiet"])
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    source = manifest["model_sources"][spec]
    assert source["library"] == {"hf": "transformers", "timm": "timm"}[library]
    assert source["weights"] == {str(weights): _sha(weights)}
    assert manifest["fingerprints"]["files"][str(weights)] == _sha(weights)
    (coverage,) = manifest["coverage"]["cascading"].values()  # the stages randomize every tensor of the library model
    assert coverage["granularity"] == "block" and coverage["share_reinitialised"] == pytest.approx(1.0)
    assert coverage["kept_trained"] == []
    # an untrained model's norms are at their default already: reset, they come out equal, and say so
    assert coverage["unchanged"] and set(coverage["unchanged"]) <= set(coverage["constant_default"])


@pytest.mark.parametrize("name", ["timm:vit_tiny_patch16_224", "hf:vit", "torchvision:convnext_tiny"])
def test_the_last_cascading_stage_re_initialises_every_tensor_of_a_library_model(tmp_path, name):
    """Perturbed first, so that no reset to a library default can look unchanged; the class token, the
    position embedding, layer scales and every LayerNorm included."""
    from attributions.graph import trace
    from audit.checks.coverage import coverage
    from audit.checks.randomization import randomization_stages
    from audit.checks.stage_options import StageSettings
    from audit.checks.stages import randomization_plan
    from tests.model_libraries import perturb

    library, arch = name.split(":")
    needs({"hf": "transformers"}.get(library, library))
    torch.manual_seed(0)
    if library == "hf":
        model = _tiny_vit(tmp_path / "vit")
    elif library == "timm":
        import timm
        model = timm.create_model(arch, num_classes=3, img_size=32)
    else:
        import torchvision
        model = torchvision.models.convnext_tiny(num_classes=3)
    model, x = perturb(model, seed=2).eval(), torch.rand(1, 3, 32, 32)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = randomization_plan(model, trace(model, x))
    *_, (_, _, last) = randomization_stages(model, StageSettings(), plan=plan)
    assert [n for n, p in last.named_parameters() if torch.equal(p, trained[n])] == []
    table = coverage(model, x)
    assert table.changed.all() and table.share.sum() == pytest.approx(1.0)
    if library == "hf":  # tokens drawn by the library's own initialiser
        assert table.set_index("tensor").how["vit.embeddings.cls_token"] == "ViTModel._init_weights"


def _planted_folder(root, marker):
    """A Hugging Face folder whose config points at its own code (``auto_map``, a model type transformers does not
    know); importing that code writes ``marker``."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({
        "model_type": "planted-net", "architectures": ["PlantedModel"],
        "auto_map": {"AutoConfig": "planted.PlantedConfig", "AutoModelForImageClassification": "planted.PlantedModel"}}))
    (root / "planted.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('the folder ran')\n")
    return root


def test_a_folder_that_points_at_its_own_code_is_refused_and_its_code_never_runs(tmp_path):
    from audit.models.libraries import refuse_remote_code

    marker = tmp_path / "marker"
    folder = _planted_folder(tmp_path / "planted", marker)
    with pytest.raises(ModelError, match=r"config.json points at code of its own \(auto_map\)"):
        refuse_remote_code(folder, f"hf:{folder}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="not readable JSON"):
        refuse_remote_code(tmp_path / "broken", "hf:broken")
    assert not marker.exists()


def test_the_real_transformers_never_runs_a_folders_code(tmp_path, monkeypatch):
    """Through transformers itself: refused by name; and with the refusal bypassed, transformers is told
    trust_remote_code=False, so it neither runs the code nor asks on stdin."""
    needs("transformers")
    marker = tmp_path / "marker"
    folder = _planted_folder(tmp_path / "planted", marker)
    with pytest.raises(ModelError, match="auto_map"):
        load_library_model(f"hf:{folder}")
    monkeypatch.setattr("audit.models.libraries.refuse_remote_code", lambda folder, spec: None)
    monkeypatch.setattr("sys.stdin", open(os.devnull))  # an answer "y" could not come from here either
    with pytest.raises(ModelError, match="cannot build hf:"):
        load_library_model(f"hf:{folder}")
    assert not marker.exists()


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    from audit.models import load_checkpoint, save_checkpoint

    model = load_checkpoint("cnn-sgd")
    with torch.no_grad():
        model.features[0].weight[0, 0, 0, 0] = float("nan")
        model.classifier[2].bias[1] = float("inf")
    save_checkpoint(model, model.metadata, tmp_path / "broken.pt")
    with pytest.raises(ModelError, match=r"2 tensors hold NaN or infinite values \(features.0.weight, classifier.2.bias"):
        resolve_model(str(tmp_path / "broken.pt"))


def test_weights_of_another_dtype_or_that_leave_tensors_out(tmp_path):
    """Integer tensors are refused, lower-precision ones cast up with a recorded warning; a file that leaves a
    tensor out or holds one of another shape is an error unless partial weights are allowed, and then recorded."""
    needs("timm", "safetensors")
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    state = {k: v.contiguous() for k, v in timm.create_model("resnet18", num_classes=4).state_dict().items()}
    save_file({**state, "fc.weight": state["fc.weight"].round().to(torch.int32)}, str(tmp_path / "int.safetensors"))
    with pytest.raises(ModelError, match="tensor fc.weight is int32, the model's float32"):
        resolve_model("timm:resnet18", str(tmp_path / "int.safetensors"), num_classes=4)
    save_file({k: v.half() if v.is_floating_point() else v for k, v in state.items()}, str(tmp_path / "half.safetensors"))
    with pytest.warns(ToolkitWarning, match="lower precision than the model's float32, cast up"):
        model = resolve_model("timm:resnet18", str(tmp_path / "half.safetensors"), num_classes=4)
    assert "lower precision than the model's float32, cast up" in model.metadata["warnings"][0]
    save_file({k: v for k, v in state.items() if k != "fc.bias"}, str(tmp_path / "part.safetensors"))
    with pytest.raises(ModelError, match=r"missing \['fc.bias'\].*--allow-partial-weights"):
        resolve_model("timm:resnet18", str(tmp_path / "part.safetensors"), num_classes=4)
    model = resolve_model("timm:resnet18", str(tmp_path / "part.safetensors"), num_classes=4, partial=True)
    assert model.metadata["partial_weights"]["missing"] == ["fc.bias"]
    with pytest.raises(ModelError, match=r"fc.weight is \[4, 512\] in the file and \[7, 512\] in the model"):
        resolve_model("timm:resnet18", str(tmp_path / "part.safetensors"), num_classes=7)


def test_a_hugging_face_folder_of_other_dtypes_is_refused_or_warned_of_though_the_library_casts(tmp_path):
    """transformers casts a folder's tensors to the config's dtype as it loads them: the file's own dtypes are read
    from its header, an integer tensor refused and a float16 one said (a ToolkitWarning and the model's warnings,
    which a run logs, records and reports)."""
    needs("transformers", "safetensors")
    from safetensors.torch import load_file, save_file

    _tiny_vit(tmp_path / "vit")
    weights = next((tmp_path / "vit").glob("*.safetensors"))
    state = load_file(str(weights))
    name = next(k for k in state if k.endswith("attention.query.weight"))
    bias = next(k for k in state if k.endswith("attention.query.bias"))
    save_file({**state, name: state[name].half(), bias: state[bias].round().to(torch.int32)}, str(weights),
              metadata={"format": "pt"})
    with pytest.raises(ModelError, match=f"tensor {bias} is int32, the model's float32"):
        load_library_model(f"hf:{tmp_path / 'vit'}")
    save_file({**state, name: state[name].half()}, str(weights), metadata={"format": "pt"})
    with pytest.warns(ToolkitWarning, match=f"1 tensors of lower precision than the model's float32, cast up on "
                                            f"loading: {name} stored as float16"):
        model = load_library_model(f"hf:{tmp_path / 'vit'}")
    assert model.metadata["warnings"] == [f"{weights}: 1 tensors of lower precision than the model's float32, cast up "
                                          f"on loading: {name} stored as float16"]


def test_a_hugging_face_folder_missing_weights_or_of_another_head_is_refused_unless_allowed(tmp_path):
    needs("transformers", "safetensors")
    from safetensors.torch import load_file, save_file

    _tiny_vit(tmp_path / "vit", labels=3)
    weights = next((tmp_path / "vit").glob("*.safetensors"))
    state = load_file(str(weights))
    dropped = [k for k in state if "attention.query" in k or "attention.key" in k]
    save_file({k: v for k, v in state.items() if k not in dropped}, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelError, match="the folder's weights do not fit the model: missing"):
        load_library_model(f"hf:{tmp_path / 'vit'}")
    model = load_library_model(f"hf:{tmp_path / 'vit'}", partial=True)
    missing = model.metadata["partial_weights"]["missing"]  # named as this transformers version names them
    assert len(missing) == len(dropped) == 4 and all("attention" in k for k in missing)
    _tiny_vit(tmp_path / "head", labels=3)
    with pytest.raises(ModelError, match="of another shape"):
        load_library_model(f"hf:{tmp_path / 'head'}", num_classes=5)
    assert load_library_model(f"hf:{tmp_path / 'head'}", num_classes=5, partial=True).metadata["partial_weights"][
        "mismatched"]


@pytest.mark.parametrize("name", ["timm:efficientvit_m0", "timm:efficientformer_l1"])
def test_a_library_model_that_caches_attention_biases_is_copied_fresh(name):
    """timm's EfficientViT-M and EfficientFormer cache their attention biases in eval mode: deepcopy refuses them;
    the audit's copy works, starts with an empty cache and computes from its own parameters."""
    needs("timm")
    import copy

    from attributions import Explainer
    from audit.models.copying import copy_model
    from tests.model_libraries import perturb

    torch.manual_seed(0)
    model = resolve_model(name, num_classes=4)
    perturb(model)
    x = torch.randn(1, 3, 224, 224)
    model(x)  # fills the cache with tensors of the autograd graph, as a user's forward pass does
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(model)
    twin = copy_model(model)
    before = Explainer(twin, "gradient").forward(x).detach()
    with torch.no_grad():
        for key, p in twin.named_parameters():
            if "attention_biases" in key:
                p.mul_(-3.0).add_(1.0)
    assert not torch.allclose(Explainer(twin, "gradient").forward(x).detach(), before)


def test_timms_rms_normalised_convnext_is_exact():
    """convnext_zepto_rms normalises with torch.var (aten.var): the gradient equals autograd's, DeepLIFT sums to
    f(x) - f(0)."""
    needs("timm")
    from attributions import Explainer
    from tests.model_libraries import perturb

    torch.manual_seed(0)
    model = resolve_model("timm:convnext_zepto_rms", num_classes=5).double()
    perturb(model)
    x = torch.randn(2, 3, 64, 64, dtype=torch.double, requires_grad=True)
    t = torch.tensor([1, 3])
    expected = torch.autograd.grad(model(x)[range(2), t].sum(), x)[0]
    assert torch.equal(Explainer(model, "gradient").attribute(x.detach(), target=t), expected)
    deeplift = Explainer(model, "deeplift").attribute(x.detach(), target=t)
    with torch.no_grad():
        difference = model(x)[range(2), t] - model(torch.zeros_like(x))[range(2), t]
    torch.testing.assert_close(deeplift.flatten(1).sum(1), difference, rtol=1e-10, atol=0)


def test_a_config_of_absurd_size_is_refused_before_it_is_built(tmp_path):
    """A Hugging Face folder whose config asks for 10^9 layers: its parameters are estimated on the meta device
    (exactly, here) and the model is refused at once, before anything is built."""
    needs("transformers")
    import transformers

    from audit.models.libraries import hf_parameter_bytes

    _tiny_vit(tmp_path / "vit")
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "vit"))
    for depth in (1, 3):
        config.num_hidden_layers = depth
        built = transformers.AutoModelForImageClassification.from_config(config)
        assert hf_parameter_bytes(transformers, config) == 4 * sum(p.numel() for p in built.parameters())
    saved = json.loads((tmp_path / "vit" / "config.json").read_text())
    (tmp_path / "vit" / "config.json").write_text(json.dumps({**saved, "num_hidden_layers": 10**9}))
    with pytest.raises(ModelError, match="GiB of float32 parameters, more than the .* GiB of memory available"):
        load_library_model(f"hf:{tmp_path / 'vit'}")  # from the estimate: building would hang
