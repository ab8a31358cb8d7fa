"""The shipped checkpoints: recipes, recorded accuracy reproduced, and the Bort targets."""
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from audit.data.datasets import embedded_sample, load_dataset
from audit.data.tags import Tag
from audit.errors import ModelError
from audit.models import available_checkpoints, load_checkpoint
from audit.models.checkpoint import SHIPPED, model_files, resolve_model
from audit.models.compare import first_conv
from audit.models.recipes import RECIPES
from audit.models.shortcut_twins import gate
from audit.models.training import evaluate
from bort.invert import reconstruction_quality
from bort.metrics import constraint_error

TWINS = [("cnn-sgd", "cnn-bort"), ("vgg-sgd", "vgg-bort"), ("resnet-sgd", "resnet-bort"), ("vit-sgd", "vit-bort")]


def test_every_recipe_is_shipped_small_and_described_by_its_metadata():
    shipped = available_checkpoints()
    assert set(shipped) == set(RECIPES)
    for name, recipe in RECIPES.items():
        meta = shipped[name]
        assert (meta["arch"], meta["optimizer"], meta["seed"], meta["epochs"]) == (
            recipe.arch, recipe.optimizer, recipe.seed, recipe.epochs), name
        hp = meta["hyperparameters"]
        assert (hp["lr"], hp["batch_size"], hp["dbort"], hp["schedule"]) == (
            recipe.lr, recipe.batch_size, recipe.dbort, recipe.schedule), name
        for key, value in recipe.options.items():
            assert hp["options"][key] == value, (name, key)
        assert meta["data"]["name"] == "fashion-mnist" and meta["data"]["train_size"] == (recipe.train_limit or 60000)
        assert meta["data"].get("label_seed") == recipe.permute_labels and meta.get("twin_of") == recipe.twin_of, name
        if recipe.twin_of is not None:  # a twin's initial weights are its own, and its pair shares its subset
            assert meta["seed"] != shipped[recipe.twin_of]["seed"] and meta["subset_seed"] == 0, name
            assert meta["twin"] == (recipe.shortcut_role if recipe.shortcut is not None else "permuted"
                                    if recipe.permute_labels is not None else "control"), name
        if recipe.shortcut is not None:  # a shortcut twin records its tag and the gate's figures
            assert Tag.from_dict(meta["shortcut"]["tag"]) == Tag.parse(recipe.shortcut), name
            assert meta["shortcut"]["role"] == recipe.shortcut_role and 0 <= meta["shortcut"]["score"] <= 1, name
            if recipe.shortcut_role == "shortcut":  # every shipped pair has its shortcut planted
                checked = gate(meta, shipped[name.replace("-shortcut", "-tag-control")])
                assert checked.planted, (name, checked.text)
    # nine trained models, eight permuted-label twins and their eight control twins (three pairs of cnn and of vgg),
    # and the shortcut twins of the four architectures
    total = sum(p.stat().st_size for p in SHIPPED.iterdir() if p.name.endswith(".pt") and ".resume" not in p.name)
    assert total < 27 * 2 ** 20


def test_recorded_accuracy_is_reproduced_on_the_full_test_split(full_fashion_mnist):
    """Exactly (one image in 10,000), for the checkpoint of each architecture trained with SGD on the true
    labels: the others share its model code and loader, and the next test checks their files."""
    x, y = load_dataset("fashion-mnist", "test")
    shipped = available_checkpoints()
    sgd = [n for n, meta in shipped.items() if meta["optimizer"] == "sgd" and meta.get("twin_of") is None]
    assert sorted(shipped[n]["arch"] for n in sgd) == sorted({meta["arch"] for meta in shipped.values()})
    for name in sgd:
        assert evaluate(load_checkpoint(name), x, y) == pytest.approx(shipped[name]["test_accuracy"], abs=1e-4), name


def test_every_checkpoint_scores_its_recorded_accuracy_on_the_embedded_sample():
    """The embedded sample is 1,000 of the test split's images (100 per class): each checkpoint's accuracy on it
    lies within four standard errors of the one recorded on the full split. A swapped, stale or corrupt file,
    or a loader that reads it wrongly, misses by far more (a permuted-label twin scores 0.1, its model 0.92)."""
    x, y = embedded_sample()
    for name, meta in available_checkpoints().items():
        p = meta["test_accuracy"]
        assert abs(evaluate(load_checkpoint(name), x, y) - p) <= 4 * (p * (1 - p) / len(y)) ** 0.5, name


@pytest.mark.parametrize("baseline,bort", TWINS)
def test_bort_keeps_accuracy_and_is_ten_times_more_orthogonal(baseline, bort):
    shipped = available_checkpoints()
    assert shipped[bort]["test_accuracy"] >= shipped[baseline]["test_accuracy"] - 0.005
    err_bort = constraint_error(load_checkpoint(bort)).orth_error.mean()
    err_base = constraint_error(load_checkpoint(baseline)).orth_error.mean()
    assert err_bort <= err_base / 10


@pytest.mark.parametrize("baseline,bort", TWINS[:2] + TWINS[3:])
def test_bort_layers_reconstruct_their_input_better(baseline, bort):
    x = torch.from_numpy(embedded_sample()[0][::10])
    scores = {}
    for name in (baseline, bort):
        model = load_checkpoint(name)
        scores[name] = float(reconstruction_quality(model, x, first_conv(model)).ssim.median())
    assert scores[bort] > scores[baseline] + 0.05, scores


@pytest.mark.parametrize("name", sorted(n for n, r in RECIPES.items() if r.arch != "vit"))
def test_trained_models_collapse_for_the_zplus_family(name):
    """Where the chain enters the first conv that reads >= 16 channels, from the logits."""
    from attributions.graph import trace
    from audit import chain_convergence

    x = torch.from_numpy(embedded_sample()[0][::125])
    family = ["lrp-zplus", "lrp-alpha1beta0", "deep-taylor", "excitation-backprop", "deeplift-ablation"]
    model = load_checkpoint(name)
    graph = trace(model, x)
    entry = next(n for n in graph.nodes if n.kind == "conv" and n.module.in_channels >= 16).inputs[0]
    df = chain_convergence(model, x, None, family, inject_at=graph.output, progress=False)
    at = df[df.layer == entry].set_index("method")["median"]
    assert len(at) == len(family) and (at >= 0.99).all(), at.to_dict()


def small_net() -> nn.Module:
    """A ``module:factory`` target for resolve_model."""
    return nn.Linear(2, 2)


def test_planted_checkpoint_and_weights_cannot_run_code(tmp_path):
    class Planted:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    torch.save({"features.0.weight": Planted()}, tmp_path / "evil.pt")
    (tmp_path / "evil.json").write_text(json.dumps({"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10}))
    with pytest.raises(ModelError, match="not a readable state_dict"):
        load_checkpoint(tmp_path / "evil.pt")
    with pytest.raises(ModelError, match="cannot load weights"):
        resolve_model("tests.audit.models.test_checkpoint:small_net", str(tmp_path / "evil.pt"))
    assert not (tmp_path / "pwned").exists()


def test_a_shipped_name_shadowed_by_a_local_file_is_ambiguous(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cnn-sgd.pt").write_bytes(b"not the shipped one")
    with pytest.raises(ModelError, match=r"'cnn-sgd' is a shipped checkpoint, and cnn-sgd.pt exists here too"):
        load_checkpoint("cnn-sgd")
    (tmp_path / "cnn-sgd.pt").unlink()
    assert load_checkpoint("cnn-sgd").metadata["arch"] == "cnn"


def test_a_folder_with_a_shipped_name_does_not_hide_the_shipped_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cnn-sgd").mkdir()  # e.g. the output folder of an earlier audit of that model
    assert load_checkpoint("cnn-sgd").metadata["arch"] == "cnn"
    assert [p.name for p in model_files("cnn-sgd")] == ["cnn-sgd.pt", "cnn-sgd.json"]
