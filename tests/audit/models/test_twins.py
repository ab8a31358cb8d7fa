"""Permuted-label twins: training one, the shipped twins, and refusing a pair of two architectures."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from audit.cli import main
from audit.data.datasets import load_dataset
from audit.errors import ConfigError
from audit.models import (
    available_checkpoints,
    load_checkpoint,
    same_architecture,
    shipped_twin,
    shipped_twins,
    twin_specs,
)
from audit.models.recipes import RECIPES
from audit.models.training import TrainConfig, train
from audit.run.config import load_config
from audit.run.runner import run_audit

SAMPLE = dict(data="fashion-mnist-sample", train_limit=128, batch_size=32)


def test_permuted_labels_are_a_seeded_permutation_of_the_true_ones_and_recorded():
    _, true = train(TrainConfig(arch="cnn", epochs=1, seed=0, **SAMPLE), progress=False, log=lambda s: None)
    _, twin = train(TrainConfig(arch="cnn", epochs=1, seed=0, permute_labels=5, twin_of="cnn-sgd", **SAMPLE),
                    progress=False, log=lambda s: None)
    assert true["data"]["labels"] == "true" and "label_seed" not in true["data"]
    assert twin["data"]["labels"] == "permuted" and twin["data"]["label_seed"] == 5 and twin["twin_of"] == "cnn-sgd"
    assert 0 <= twin["train_accuracy"] <= 1 and 0 <= twin["test_accuracy"] <= 1
    # the permutation: the same label counts (a permutation of the subset's labels), other labels per image
    _, y = load_dataset("fashion-mnist-sample", "train")
    order = np.sort(np.random.default_rng(0).permutation(len(y))[:128])
    permuted = y[order][np.random.default_rng(5).permutation(128)]
    assert np.array_equal(np.bincount(permuted, minlength=10), np.bincount(y[order], minlength=10))
    assert (permuted != y[order]).mean() > 0.5
    assert twin["data"]["sha256"] != true["data"]["sha256"]  # the training labels differ


@pytest.mark.parametrize("arch", ["cnn", "vgg", "resnet", "vit"])
def test_each_shipped_architecture_has_twins_that_fit_their_permuted_labels(arch):
    """Every pair of the architecture (three for the CNN and the VGG, one for the others): its permuted-label twin
    fits its own permutation and is at chance on the true labels, its control twin learned the true ones; each
    pair's seeds its own."""
    assert shipped_twin(f"{arch}-sgd") == f"{arch}-permuted"
    names, controls = shipped_twins(f"{arch}-sgd"), shipped_twins(f"{arch}-sgd", "control")
    assert len(names) == len(controls) == (3 if arch in ("cnn", "vgg") else 1)
    seen = set()
    for k, (name, control) in enumerate(zip(names, controls), start=1):
        meta, reference = available_checkpoints()[name], available_checkpoints()[control]
        assert name in RECIPES and control in RECIPES
        assert meta["twin_of"] == reference["twin_of"] == f"{arch}-sgd" and meta["data"]["labels"] == "permuted"
        assert meta["data"]["label_seed"] == k and (meta["seed"], reference["seed"]) == (2 * k - 1, 2 * k)
        assert meta["train_accuracy"] >= 0.95, meta["train_accuracy"]  # fitted the random labels
        assert meta["test_accuracy"] < 0.15, meta["test_accuracy"]  # chance on the true test labels
        assert reference["test_accuracy"] > 0.8, reference["test_accuracy"]  # learned the true labels
        assert meta["data"]["train_size"] == RECIPES[name].train_limit
        seen |= {meta["data"]["sha256"]}
        same_architecture(load_checkpoint(f"{arch}-sgd"), load_checkpoint(name), f"{arch}-sgd", name)
    assert len(seen) == len(names)  # each pair's labels permuted its own way


def test_a_twin_of_another_architecture_is_refused():
    with pytest.raises(ConfigError, match="architectures differ|it is a SmallVGG"):
        same_architecture(load_checkpoint("cnn-sgd"), load_checkpoint("vgg-permuted"), "cnn-sgd", "vgg-permuted")
    wider = torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False))
    with pytest.raises(ConfigError, match=r"0.weight is \[2, 4\] in the model and \[3, 4\] in the twin"):
        same_architecture(torch.nn.Sequential(torch.nn.Linear(4, 2, bias=False)), wider, "a", "b")


def test_twin_lookup_prefers_the_users_and_refuses_a_library_model():
    assert twin_specs("cnn-sgd", {}) == ["cnn-permuted", "cnn-permuted-2", "cnn-permuted-3"]  # three shipped pairs
    assert twin_specs("cnn-sgd", {}, "control") == ["cnn-control", "cnn-control-2", "cnn-control-3"]
    assert twin_specs("resnet-sgd", {}) == ["resnet-permuted"]
    assert twin_specs("cnn-sgd", {"cnn-sgd": "mine.pt"}) == ["mine.pt"]
    assert twin_specs("cnn-sgd", {"cnn-sgd": ["a.pt", "b.pt"]}) == ["a.pt", "b.pt"]
    assert twin_specs("cnn-bort", {}) == []  # no shipped Bort twin: the check says so and skips it
    with pytest.raises(ConfigError, match="library model"):
        twin_specs("timm:resnet18", {"timm:resnet18": ["mine.pt", "timm:resnet18"]})


def test_several_pairs_are_given_as_a_list_or_the_model_named_again():
    config = load_config(models=["cnn-sgd"], twins="cnn-sgd=a.pt,cnn-sgd=b.pt", controls={"cnn-sgd": ["c.pt", "d.pt"]})
    assert config.twins == {"cnn-sgd": ["a.pt", "b.pt"]} and config.controls == {"cnn-sgd": ["c.pt", "d.pt"]}
    assert load_config(models=["cnn-sgd"], twins="cnn-sgd=a.pt").twins == {"cnn-sgd": "a.pt"}
    for bad in ({"cnn-sgd": []}, {"cnn-sgd": ["a.pt", 3]}, {"cnn-sgd": ""}):
        with pytest.raises(ConfigError, match="one or a list of them"):
            load_config(models=["cnn-sgd"], twins=bad)
    with pytest.raises(ConfigError, match="2 permuted-label twins and 1 control twins"):
        run_audit(load_config(models=["cnn-sgd"], methods="gradient", tests="data-randomization", n_images=2,
                              twins={"cnn-sgd": ["cnn-permuted", "cnn-permuted-2"]}, controls={"cnn-sgd": "cnn-control"}),
                  "unused-folder", progress=False, log=lambda s: None)


def test_cli_trains_the_twin_of_a_checkpoint_and_refuses_another_architecture(tmp_path, capsys):
    rc = main(["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "64",
               "--permute-labels", "2", "--twin-of", "cnn-sgd", "--fit-accuracy", "off", "--out", str(tmp_path / "t.pt"),
               "--quiet"])
    meta = json.loads((tmp_path / "t.json").read_text())
    assert rc == 0 and meta["twin_of"] == "cnn-sgd" and meta["data"]["label_seed"] == 2
    assert main(["train", "--arch", "vgg", "--permute-labels", "2", "--twin-of", "cnn-sgd", "--out",
                 str(tmp_path / "v.pt"), "--quiet"]) == 2
    assert "it is a SmallVGG, the model a SmallCNN" in (err := capsys.readouterr().err) and "pass --arch cnn" in err
    assert main(["train", "--arch", "cnn", "--twin-of", "cnn-sgd", "--out", str(tmp_path / "w.pt"), "--quiet"]) == 2
    assert "add --permute-labels" in capsys.readouterr().err


def test_cli_trains_n_twin_pairs_and_the_audit_reads_them_as_pairs(tmp_path, capsys):
    """train --pairs 2 makes two permuted-label twins (label seeds 1, 2; initial weights 1, 3) and their control
    twins (2, 4) on one subset; the line it prints audits the model against them, and the data-randomization cells
    resample the two pairs."""
    mine = str(tmp_path / "mine.pt")
    common = ["--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "64", "--quiet"]
    assert main(["train", *common, "--out", mine]) == 0
    assert main(["train", *common, "--twin-of", mine, "--pairs", "2", "--fit-accuracy", "off", "--out",
                 str(tmp_path / "tw.pt")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    metas = {k: json.loads((tmp_path / f"tw-{k}.json").read_text())
             for k in ("permuted-1", "control-1", "permuted-2", "control-2")}
    assert [(m["seed"], m["data"].get("label_seed"), m["twin"], m["subset_seed"]) for m in metas.values()] == [
        (1, 1, "permuted", 0), (2, None, "control", 0), (3, 2, "permuted", 0), (4, None, "control", 0)]
    twins, controls = (line.split(f"--{k} ")[1].split(" ")[0].replace("MODEL", mine) for k in ("twins", "controls"))
    out = tmp_path / "run"
    assert main(["run", "--models", mine, "--methods", "gradient,edge", "--tests", "data-randomization",
                 "--n-images", "8", "--twins", twins, "--controls", controls, "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "results" / "data_randomization.csv")
    assert sorted(table.twin_pair.unique()) == [0, 1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["control"]["seed"] for p in manifest["twins"]["mine"]["pairs"]] == [2, 4]
    assert "2 twin pairs resampled" in (out / "report.md").read_text()
    assert main(["train", *common, "--twin-of", mine, "--pairs", "2", "--control", "3", "--out",
                 str(tmp_path / "x.pt")]) == 2
    assert "--pairs N trains N permuted-label twins" in capsys.readouterr().err


def test_train_takes_any_model_spec_and_its_checkpoint_loads_as_that_model(tmp_path, monkeypatch, capsys):
    (tmp_path / "twin_factories.py").write_text("from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Flatten(), "
                                          "nn.Linear(784, 10))\n\ndef small():\n    return nn.Sequential(nn.Flatten(), "
                                          "nn.Linear(784, 5))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model, meta = train(TrainConfig(model="twin_factories:make", epochs=1, **SAMPLE), out=tmp_path / "f.pt", progress=False,
                        log=lambda s: None)
    assert meta["model"] == meta["arch"] == "twin_factories:make" and meta["num_classes"] == 10
    loaded = load_checkpoint(str(tmp_path / "f.pt"))
    assert isinstance(loaded, torch.nn.Sequential)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    # a checkpoint's architecture, freshly initialised: the twin of a shipped model
    _, twin = train(TrainConfig(model="cnn-sgd", epochs=1, permute_labels=1, twin_of="cnn-sgd", **SAMPLE),
                    progress=False, log=lambda s: None)
    assert twin["model"] == "cnn-sgd" and twin["twin_of"] == "cnn-sgd"
    with pytest.raises(ConfigError, match=r"twin_factories:small gives outputs of shape \[1, 5\] for one image, the data "
                                          "have 10 classes"):
        train(TrainConfig(model="twin_factories:small", epochs=1, **SAMPLE), progress=False, log=lambda s: None)
    (tmp_path / "rgb.py").write_text("from torch import nn\n\ndef make():\n    return nn.Sequential(nn.Conv2d(3, 4, 3), "
                                     "nn.Flatten(), nn.LazyLinear(10))\n")
    with pytest.raises(ConfigError, match=r"rgb:make does not take the data's images, of shape \[1, 28, 28\]"):
        train(TrainConfig(model="rgb:make", epochs=1, **SAMPLE), progress=False, log=lambda s: None)
    with pytest.raises(ConfigError, match=r"--num-classes 7, but the data have 10 classes"):
        train(TrainConfig(model="twin_factories:make", num_classes=7, epochs=1, **SAMPLE), progress=False, log=lambda s: None)
    assert main(["train", "--model", "twin_factories:make", "--arch", "vgg", "--out", str(tmp_path / "x.pt")]) == 2
    assert "--model trains that model's architecture: drop --arch" in capsys.readouterr().err
