"""Coverage: what the stages re-initialised, in the check's rows, the results, the manifest and the report."""
import json
import warnings

import pandas as pd
import pytest
import torch

from audit import parameter_randomization
from audit.checks.coverage import KEPT, coverage, describe
from audit.models import load_checkpoint
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports import report_sections


def _count(model: torch.nn.Module, prefixes: list[str]) -> float:
    """The share of ``model``'s parameters (elements) whose names start with one of ``prefixes``, counted here."""
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    hit = sum(v for n, v in sizes.items() if any(n == p or n.startswith(p + ".") for p in prefixes))
    return hit / sum(sizes.values())


def test_the_rows_share_is_the_count_of_what_each_stage_re_initialised():
    model = load_checkpoint("vit-sgd")
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([3, 7])
    df = parameter_randomization(model, x, y, ["gradient"], progress=False)  # auto: the ViT's blocks
    stages = df.drop_duplicates("stage")
    assert stages.layer.tolist() == ["original", "head", "norm", "blocks.3", "blocks.2", "blocks.1", "blocks.0",
                                     "pos", "cls", "patch"]
    for k in range(len(stages)):
        assert stages.share.iloc[k] == pytest.approx(_count(model, stages.layer.iloc[1:k + 1].tolist()), abs=1e-12)
    assert stages.share.iloc[-1] == 1.0
    independent = parameter_randomization(model, x, y, ["gradient"], order="independent", progress=False)
    for name, share in independent.drop_duplicates("stage")[["layer", "share"]].values[1:]:
        assert share == pytest.approx(_count(model, [name]), abs=1e-12)


def test_coverage_rows_name_every_tensor_and_how_it_was_drawn():
    model = load_checkpoint("vit-sgd")
    table = coverage(model, torch.rand(1, 1, 28, 28), "cascading")
    assert sorted(table.tensor) == sorted(n for n, _ in model.named_parameters())
    assert table.share.sum() == pytest.approx(1.0, abs=1e-12) and table.changed.all()
    assert table[table.tensor == "head.weight"].stage.item() == 1  # cascading: from the logits down
    norms = table[table.tensor.str.contains("norm")]
    assert norms.how.str.startswith("LayerNorm.reset_parameters").all() and norms.how.str.contains("constant").all()
    text = describe(table)
    assert "stage 1: head (" in text and "re-initialise 100.0 % of the parameters" in text
    constant = len(norms) + sum(n.endswith("in_proj_bias") for n in table.tensor)  # attention's input biases: zeros
    assert f"; {constant} tensors (" in text and "not drawn at random" in text


def test_keep_stats_leaves_the_batchnorm_tensors_trained_and_says_which():
    model = load_checkpoint("resnet-sgd")
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([1, 2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = parameter_randomization(model, x, y, ["gradient"], bn="keep-stats", granularity="layer", progress=False)
    bns = [f"{m}.{n}" for m, module in model.named_modules() if isinstance(module, torch.nn.BatchNorm2d)
           for n, _ in module.named_parameters()]
    assert any("keep-stats' leaves 42 BatchNorm parameter tensors trained" in str(w.message) and "bn1.weight" in
               str(w.message) for w in caught)
    assert df.share.max() == pytest.approx(1 - _count(model, bns), abs=1e-12)
    table = coverage(model, x, "cascading", granularity="layer", bn="keep-stats")
    assert sorted(table[table.how == KEPT].tensor) == sorted(bns)


def test_a_run_records_coverage_in_results_manifest_and_report(tmp_path):
    out = tmp_path / "run"
    run_audit(load_config(models=["vit-sgd", "cnn-sgd"], methods=["gradient"], tests=["cascading"], n_images=2), out,
              progress=False, log=lambda s: None)
    rows = pd.read_csv(out / "results" / "randomization_cascading_coverage.csv")
    manifest = json.loads((out / "manifest.json").read_text())
    vit = load_checkpoint("vit-sgd")
    for label in ("vit-sgd", "cnn-sgd"):
        mine = rows[rows.model == label]
        assert sorted(mine.tensor) == sorted(n for n, _ in load_checkpoint(label).named_parameters())
        record = manifest["coverage"]["cascading"][label]
        assert record["share_reinitialised"] == pytest.approx(1.0) and record["kept_trained"] == []
    record = manifest["coverage"]["cascading"]["vit-sgd"]
    assert record["granularity"] == "block" and record["stages"] == 9
    assert manifest["coverage"]["cascading"]["cnn-sgd"]["granularity"] == "layer"
    assert sorted(record["constant_default"]) == sorted(
        n for n, _ in vit.named_parameters() if "norm" in n or n.endswith("in_proj_bias"))
    results = pd.read_csv(out / "results" / "randomization_cascading.csv")
    assert results[results.model == "vit-sgd"].share.max() == 1.0
    section = next(s for s in report_sections(out) if s.title == "Parameter randomization (cascading)")
    assert "On vit-sgd: stage 1: head (" in section.text and "On cnn-sgd: stage 1: classifier.2 (" in section.text
    assert section.text.count("re-initialise 100.0 % of the parameters") == 2
