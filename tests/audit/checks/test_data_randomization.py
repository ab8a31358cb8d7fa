"""The data-randomization test on the shipped CNN and its permuted-label twin, and end to end on a pair a user
trains."""
import json

import pandas as pd
import pytest
import torch

from audit import embedded_sample, load_checkpoint, shipped_twin
from audit.checks import get_check
from audit.checks.base import NOT_REJECTED, REJECTED
from audit.checks.data_randomization import data_randomization
from audit.checks.replicates import replicate_seed
from audit.cli import main
from audit.errors import ConfigError
from audit.models import shipped_twins
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports.verdict import verdict_table


@pytest.fixture(scope="module")
def images():
    x, y = embedded_sample()
    pick = [i for c in range(10) for i in range(len(y)) if y[i] == c][::50]  # two images per class
    return torch.from_numpy(x[pick]), torch.from_numpy(y[pick])


def test_the_edge_control_is_rejected_and_the_gradient_of_a_twin_is_not(images):
    x, y = images
    model, twin = load_checkpoint("cnn-sgd"), load_checkpoint("cnn-permuted")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    table, maps = data_randomization(model, twin, x, y, ["gradient", "edge"], progress=False, keep_maps=2)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is not modified
    assert maps["gradient"].shape == (2, 2, 28, 28)
    config = load_config(models=["cnn-sgd"], methods="gradient,edge", tests="data-randomization")
    check = get_check("data-randomization")
    rule, options = check.verdict, check.options_from(config.options)
    edge = rule.evaluate(table[table.method == "edge"], options)
    gradient = rule.evaluate(table[table.method == "gradient"], options)
    assert edge.outcome == REJECTED and edge.score == pytest.approx(1.0)  # the map does not depend on the model
    assert gradient.outcome == NOT_REJECTED and gradient.score < 0.3, gradient.text


def test_a_pair_of_two_architectures_is_refused(images):
    x, y = images
    with pytest.raises(ConfigError, match="architectures differ|it is a"):
        data_randomization(load_checkpoint("cnn-sgd"), load_checkpoint("vgg-permuted"), x, y, ["gradient"],
                           progress=False)
    with pytest.raises(ConfigError, match="cannot be the twin of cnn-sgd"):
        run_audit(load_config(models=["cnn-sgd"], methods="gradient", tests="data-randomization", n_images=4,
                              twins={"cnn-sgd": "vgg-permuted"}), "unused-folder", progress=False, log=lambda s: None)


def test_end_to_end_on_a_model_and_twins_the_user_trains(tmp_path, capsys):
    """Train a small model, its permuted-label twin and its control twin with the CLI, audit the trio; a model
    without a twin is skipped and the manifest, the log and the verdict say so. The twin, one epoch on permuted
    labels, does not reach the 95 % it is trained to: its training fails, and the audit flags it."""
    mine = str(tmp_path / "mine.pt")
    assert main(["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--twin-of", "cnn-sgd", "--out",
                 str(tmp_path / "x.pt")]) == 2
    assert "add --permute-labels SEED (the permuted-label twin), --control SEED" in capsys.readouterr().err
    for name, extra, code in (("mine", [], 0),
                              ("mine-twin", ["--permute-labels", "7", "--twin-of", mine, "--subset-seed", "0"], 2),
                              ("mine-control", ["--control", "3", "--twin-of", mine, "--subset-seed", "0"], 0)):
        assert main(["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit",
                     "64", "--out", str(tmp_path / f"{name}.pt"), "--quiet", *extra]) == code
    assert "does not fit its permuted training labels" in capsys.readouterr().err
    out = tmp_path / "run"
    rc = main(["run", "--models", f"{mine},cnn-bort", "--methods", "gradient,edge", "--tests",
               "data-randomization", "--n-images", "6", "--twins", f"{mine}={tmp_path / 'mine-twin.pt'}",
               "--controls", f"{mine}={tmp_path / 'mine-control.pt'}", "--out", str(out), "--quiet"])
    assert rc == 0
    manifest = json.loads((out / "manifest.json").read_text())
    (twin,) = manifest["twins"]["mine"]["pairs"]
    assert twin["fits"] is False and twin["control"]["fits"] is None
    assert "does not fit its permuted labels (training accuracy" in capsys.readouterr().out
    assert twin["label_seed"] == 7 and twin["labels"] == "permuted"
    control = twin["control"]
    assert control["labels"] == "true" and control["seed"] == 3 and control["subset_seed"] == 0
    assert twin["seed"] == 0 and twin["subset_seed"] == 0
    assert "no permuted-label twin" in manifest["skipped"]["data-randomization"]["cnn-bort"]
    table = pd.read_csv(out / "results" / "data_randomization.csv")
    assert set(table.model) == {"mine"} and len(table) == 12
    assert table.control_spearman_abs.notna().all() and table.untrained_spearman_abs.notna().all()
    config = load_config(models=["m"], methods="gradient,edge", tests="data-randomization")
    verdict = verdict_table({"data-randomization": table}, config).set_index("method")
    assert verdict.loc["edge", "verdict"].startswith(REJECTED) and verdict.loc["edge", "control_check"] == "as expected"
    report = (out / "report.md").read_text()
    assert "Skipped (no twin): cnn-bort" in report and "## Data randomization" in report
    assert "NO (" in report and "not a model that fits its labels" in report
    assert "rests on one twin pair" in verdict.loc["gradient", "data_randomization"]


def test_images_are_shared_out_over_the_twin_pairs_as_over_the_seeds(images):
    """With three pairs, image i is compared with the twins of pair (i // images_per_seed) mod 3: its scores are
    those that pair alone gives it (its SmoothGrad noise its own whatever the images beside it), the pairs and the
    seeds are recorded, and the verdict's interval resamples the pairs."""
    x, y = images
    model = load_checkpoint("cnn-sgd")
    twins = [load_checkpoint(n) for n in shipped_twins("cnn-sgd")]
    controls = [load_checkpoint(n) for n in shipped_twins("cnn-sgd", "control")]
    assert shipped_twins("cnn-sgd") == ["cnn-permuted", "cnn-permuted-2", "cnn-permuted-3"]
    table, _ = data_randomization(model, twins, x[:8], y[:8], ["gradient", "smoothgrad"], progress=False,
                                  control=controls, seed=4)
    grad = table[table.method == "gradient"].reset_index(drop=True)
    assert grad.twin_pair.tolist() == [0, 0, 1, 1, 2, 2, 0, 0] and grad.untrained_replicate.tolist() == [0, 0, 1, 1,
                                                                                                        2, 2, 3, 3]
    for k in range(3):
        mine = table[table.twin_pair == k]
        alone, _ = data_randomization(model, twins[k], x[:8][mine.image.unique()], y[:8][mine.image.unique()],
                                      ["gradient", "smoothgrad"], progress=False, control=controls[k], seed=4)
        for column in ("spearman_abs", "control_spearman_abs", "ssim"):
            # up to a rank swapped by float rounding in another batch
            assert mine[column].to_numpy() == pytest.approx(alone[column].to_numpy(), abs=1e-4), (k, column)
    with pytest.raises(ConfigError, match="3 permuted-label twins and 2 control twins"):
        data_randomization(model, twins, x[:2], y[:2], ["gradient"], progress=False, control=controls[:2])
    check = get_check("data-randomization")
    rule = check.verdict
    assert rule.pairs(grad) == 3 and rule.twin_groups(grad).tolist() == grad.twin_pair.tolist()
    assert "3 twin pairs resampled" in rule.evaluate(grad, check.options()).text


@pytest.mark.parametrize("arch", ["cnn", "vgg", "resnet", "vit"])
def test_every_shipped_architecture_runs_against_its_shipped_twins(arch, images):
    """The permuted-label and control twins, found by their metadata; the untrained copy leaves the model as it
    was, and the edge control scores 1 against every reference."""
    x, y = images
    model = load_checkpoint(f"{arch}-sgd")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert (shipped_twin(f"{arch}-sgd"), shipped_twin(f"{arch}-sgd", "control")) == (f"{arch}-permuted",
                                                                                  f"{arch}-control")
    table, _ = data_randomization(model, load_checkpoint(f"{arch}-permuted"), x[:6], y[:6], ["gradient", "edge"],
                                  progress=False, control=load_checkpoint(f"{arch}-control"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(table) == 12 and table.ssim.notna().all() and table.control_spearman_abs.notna().all()
    edge = table[table.method == "edge"]
    for column in ("ssim", "control_spearman_abs", "untrained_spearman_abs"):
        assert edge[column].to_numpy() == pytest.approx(1.0, abs=1e-12), column
    assert table[table.method == "gradient"].ssim.median() < 0.5


def test_the_untrained_floor_shares_its_seeds_out_over_the_images(images):
    """Images 2r and 2r + 1 are compared with an untrained copy drawn with replicate r's seed: their floor scores
    equal the ones an untrained copy with that seed alone gives them (up to a rank swapped by float rounding in
    another batch), and a block keeps the run's replicates."""
    x, y = images
    model, twin, control = (load_checkpoint(n) for n in ("cnn-sgd", "cnn-permuted", "cnn-control"))
    table, _ = data_randomization(model, twin, x[:6], y[:6], ["gradient"], progress=False, control=control, seed=4)
    assert table.untrained_replicate.tolist() == [0, 0, 1, 1, 2, 2]
    for r in range(3):
        alone, _ = data_randomization(model, twin, x[2 * r:2 * r + 2], y[2 * r:2 * r + 2], ["gradient"],
                                      progress=False, control=control, seed=replicate_seed(4, r), images_per_seed=2)
        assert table.untrained_spearman_abs[2 * r:2 * r + 2].to_numpy() == pytest.approx(
            alone.untrained_spearman_abs, abs=1e-4)
    block, _ = data_randomization(model, twin, x[3:6], y[3:6], ["gradient"], progress=False, control=control,
                                  seed=4, first_image=3)
    assert block.untrained_replicate.tolist() == [1, 2, 2]
    assert block.untrained_spearman_abs.to_numpy() == pytest.approx(table.untrained_spearman_abs[3:], abs=1e-4)
