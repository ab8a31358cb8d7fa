"""Permuted-label twins: training one, the shipped twins, and refusing a pair of two architectures."""
import json

import numpy as np
import pytest
import torch

from audit.cli import main
from audit.data.datasets import load_dataset
from audit.errors import ConfigError
from audit.models import available_checkpoints, load_checkpoint, same_architecture, shipped_twin, twin_spec
from audit.models.recipes import RECIPES
from audit.models.training import TrainConfig, train

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
def test_each_shipped_architecture_has_a_twin_that_fits_its_permuted_labels(arch):
    name = shipped_twin(f"{arch}-sgd")
    assert name == f"{arch}-permuted" and name in RECIPES
    meta = available_checkpoints()[name]
    assert meta["twin_of"] == f"{arch}-sgd" and meta["data"]["labels"] == "permuted"
    assert meta["train_accuracy"] >= 0.95, meta["train_accuracy"]  # fitted the random labels
    assert meta["test_accuracy"] < 0.15, meta["test_accuracy"]  # chance on the true test labels
    assert meta["data"]["train_size"] == RECIPES[name].train_limit
    same_architecture(load_checkpoint(f"{arch}-sgd"), load_checkpoint(name), f"{arch}-sgd", name)


def test_a_twin_of_another_architecture_is_refused():
    with pytest.raises(ConfigError, match="architectures differ|it is a SmallVGG"):
        same_architecture(load_checkpoint("cnn-sgd"), load_checkpoint("vgg-permuted"), "cnn-sgd", "vgg-permuted")
    wider = torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False))
    with pytest.raises(ConfigError, match=r"0.weight is \[2, 4\] in the model and \[3, 4\] in the twin"):
        same_architecture(torch.nn.Sequential(torch.nn.Linear(4, 2, bias=False)), wider, "a", "b")


def test_twin_lookup_prefers_the_users_and_refuses_a_library_model():
    assert twin_spec("cnn-sgd", {}) == "cnn-permuted"
    assert twin_spec("cnn-sgd", {"cnn-sgd": "mine.pt"}) == "mine.pt"
    assert twin_spec("cnn-bort", {}) is None  # no shipped Bort twin: the check says so and skips it
    with pytest.raises(ConfigError, match="library model"):
        twin_spec("timm:resnet18", {"timm:resnet18": "timm:resnet18"})


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
