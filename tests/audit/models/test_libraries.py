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
    model = resolve_model("torchvision:mobilenet_v3_small", num_classes=3)
    assert model.metadata["weights"] == "random initialisation" and model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    with pytest.raises(ModelError, match="torchvision has no model 'resnet5'"):
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
    *_, (_, _, last) = randomization_stages(model, "cascading", "reset", 0, plan)
    assert [n for n, p in last.named_parameters() if torch.equal(p, trained[n])] == []
    table = coverage(model, x)
    assert table.changed.all() and table.share.sum() == pytest.approx(1.0)
    if library == "hf":  # tokens drawn by the library's own initialiser
        assert table.set_index("tensor").how["vit.embeddings.cls_token"] == "ViTModel._init_weights"
