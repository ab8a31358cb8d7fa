"""Twins of the models users audit: a permuted-label and a control twin of a timm, a torchvision and a Hugging Face
model trained with ``train --model`` on a generated image folder (streamed, a few steps, small inputs), the model
audited against them with ``run --twins``; a twin of another architecture refused, the first differing tensor named.

Runs in ``.venv-libraries`` (``make test``); in the main venv the libraries are missing and it skips.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from audit.cli import main
from audit.models import load_checkpoint
from audit.models.libraries import load_library_model
from tests.audit.models.test_libraries import _tiny_vit, needs

CLASSES = 3


def _folder(root, size=32):
    """train/ (6 images per class) and test/ (2 per class) of random RGB images."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("test", 2)):
        for c in range(CLASSES):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                    root / split / f"c{c}" / f"{i}.png")
    return root


def _spec(library, tmp_path):
    needs({"hf": "transformers"}.get(library, library))
    if library == "hf":
        _tiny_vit(tmp_path / "vit", labels=CLASSES)
        return f"hf:{tmp_path / 'vit'}"
    return f"{library}:resnet18"


@pytest.mark.parametrize("library", ["timm", "torchvision", "hf"])
def test_the_twins_of_a_library_model_are_trained_from_an_image_folder_and_audited_against(tmp_path, library,
                                                                                           capsys):
    spec = _spec(library, tmp_path)
    data = _folder(tmp_path / "images")
    common = ["train", "--model", spec, "--data", "imagefolder", "--data-root", str(data), "--epochs", "1",
              "--batch-size", "6", "--quiet"]
    assert main([*common, "--out", str(tmp_path / "mine.pt")]) == 0
    mine = load_checkpoint(str(tmp_path / "mine.pt"))
    assert mine.metadata["model"] == spec and mine.metadata["num_classes"] == CLASSES
    assert mine.metadata["library"] == {"hf": "transformers"}.get(library, library) and mine.metadata["library_version"]
    assert type(mine) is type(load_library_model(spec, num_classes=CLASSES))
    for name, role in (("twin", ["--permute-labels", "1", "--fit-accuracy", "off"]), ("control", ["--control", "2"])):
        assert main([*common, *role, "--twin-of", str(tmp_path / "mine.pt"), "--subset-seed", "0",
                     "--out", str(tmp_path / f"{name}.pt")]) == 0
    twin = json.loads((tmp_path / "twin.json").read_text())
    assert twin["twin_of"] == str(tmp_path / "mine.pt") and twin["data"]["labels"] == "permuted"
    assert json.loads((tmp_path / "control.json").read_text())["twin"] == "control"
    # audited as the library model with the trained weights, against its twins
    model = ["--models", spec, "--num-classes", str(CLASSES), "--weights", str(tmp_path / "mine.pt")]
    out = tmp_path / "run"
    assert main(["run", *model, "--twins", f"{spec}={tmp_path / 'twin.pt'}", "--controls",
                 f"{spec}={tmp_path / 'control.pt'}", "--methods", "gradient,edge", "--tests", "data-randomization",
                 "--data", "imagefolder", "--data-root", str(data / "test"), "--n-images", "4", "--out", str(out),
                 "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    ((facts,),) = (record["pairs"] for record in manifest["twins"].values())
    assert facts["labels"] == "permuted" and facts["control"]["labels"] == "true"
    rows = (out / "results" / "data_randomization.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 4  # two methods, four images
    capsys.readouterr()


def test_a_twin_of_another_library_architecture_is_refused_naming_the_first_differing_tensor(tmp_path, capsys):
    needs("timm")
    data = _folder(tmp_path / "images", size=16)
    code = main(["train", "--model", "timm:resnet34", "--twin-of", "timm:resnet18", "--permute-labels", "1",
                 "--data", "imagefolder", "--data-root", str(data), "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "t.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "--twin-of timm:resnet18: the model this run trains cannot be the twin of timm:resnet18" in err
    assert "their architectures differ (the twin has layer1.2.bn1.bias, the model does not)" in err
    assert "pass --model timm:resnet18" in err and not (tmp_path / "t.pt").exists()


def test_a_timm_models_shortcut_twins_are_trained_from_an_image_folder_and_audited(tmp_path, capsys):
    """train --shortcut on a timm model streams a folder with the tag pasted on the images of its role; the pair
    records its tag and gate; run --tests shortcut reads it (random images, one epoch: the gate is missed, and
    every cell says so)."""
    spec = _spec("timm", tmp_path)
    data = _folder(tmp_path / "images")
    stem = tmp_path / "tw"
    assert main(["train", "--model", spec, "--data", "imagefolder", "--data-root", str(data), "--epochs", "1",
                 "--batch-size", "6", "--shortcut", "class=2,pattern=white,size=4",
                 "--quiet", "--out", str(stem)]) == 0
    assert "shortcut twins" in capsys.readouterr().out
    metas = [json.loads((tmp_path / f"tw-{r}.json").read_text()) for r in ("shortcut", "tag-control")]
    assert [m["shortcut"]["role"] for m in metas] == ["shortcut", "tag-control"]
    assert all(m["shortcut"]["tagged_images"] == 3 and m["data"]["root"] == str(data) for m in metas)
    out = tmp_path / "run"
    assert main(["run", "--models", spec, "--num-classes", str(CLASSES), "--weights", f"{stem}-shortcut.pt",
                 "--shortcuts", f"{spec}={stem}", "--methods", "gradient,edge,random", "--tests", "shortcut",
                 "--data", "imagefolder", "--data-root", str(data / "test"),
                 "--n-images", "6", "--out", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (record,) = manifest["shortcuts"].values()
    assert record["tag"]["target"] == 2 and record["shortcut"] == f"{stem}-shortcut.pt"
    rows = (out / "results" / "shortcut.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 4  # three methods, the four test images of the other classes
    capsys.readouterr()
