"""Shortcut twins: trained with their tag on the right images, their gate figures recorded and read, and audited
through every entry point (the trainer, the command line, the runner and its report)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from audit.cli import main
from audit.data.tags import Tag
from audit.errors import ConfigError
from audit.models.shortcut_twins import ACCURACY_GAP, LINKED, UNLINKED, gate, pair_specs, shortcut_score
from audit.models.splits import ArraySplit, TaggedSplit, index_batches
from audit.models.tag_readers import tag_reader
from audit.models.training import TrainConfig, train

SAMPLE = dict(data="fashion-mnist-sample", train_limit=256, batch_size=32, epochs=1)
TAG = Tag(target=1, pattern="white", size=3, place="top-right")


def test_a_tagged_split_pastes_the_tag_on_its_rows_alone():
    x = np.random.default_rng(0).random((10, 1, 8, 8)).astype(np.float32)
    rows = np.arange(10) % 3 == 0
    split = TaggedSplit(ArraySplit(x, np.zeros(10, dtype=np.int64)), rows, Tag(size=2))
    batches = index_batches(torch.arange(10), 4)
    out = torch.cat(list(split.images(batches)))
    assert torch.equal(out[rows], Tag(size=2).paste(torch.from_numpy(x[rows])))
    assert torch.equal(out[~rows], torch.from_numpy(x[~rows]))
    assert split.fingerprint() != TaggedSplit(split.base, ~rows, Tag(size=2)).fingerprint()


def test_the_shortcut_score_is_the_share_of_other_classes_predicted_the_tags_class_once_tagged():
    x = np.zeros((6, 1, 28, 28), dtype=np.float32)
    y = np.array([0, 0, 1, 2, 3, 0])
    tag = Tag(target=0)
    reader = tag_reader(tag)  # predicts class 0 exactly where the tag is
    assert shortcut_score(reader, ArraySplit(x, y), tag) == 1.0
    assert shortcut_score(tag_reader(tag, uses_tag=False), ArraySplit(x, y), tag) == 0.0
    assert np.isnan(shortcut_score(reader, ArraySplit(x, np.zeros(6, dtype=np.int64)), tag))


def _meta(role: str, score: float, accuracy: float, tag: Tag = TAG) -> dict:
    return {"test_accuracy": accuracy, "shortcut": {"tag": tag.to_dict(), "role": role, "score": score}}


@pytest.mark.parametrize("shortcut,control,missed", [
    (_meta("shortcut", LINKED, 0.9), _meta("tag-control", UNLINKED, 0.9 + ACCURACY_GAP), None),
    (_meta("shortcut", LINKED - 0.01, 0.9), _meta("tag-control", 0.0, 0.9), "does not use the tag"),
    (_meta("shortcut", 1.0, 0.9), _meta("tag-control", UNLINKED + 0.01, 0.9), "reacts to the tag"),
    (_meta("shortcut", 1.0, 0.9), _meta("tag-control", 0.0, 0.87), "changed what the twins learned"),
    (_meta("shortcut", 1.0, 0.9), _meta("shortcut", 0.0, 0.9), "not a shortcut twin and its tag control"),
    (_meta("shortcut", 1.0, 0.9), _meta("tag-control", 0.0, 0.9, Tag(size=2)), "different tags"),
    (_meta("shortcut", float("nan"), 0.9), _meta("tag-control", 0.0, 0.9), "does not use the tag")])
def test_the_gate_holds_each_condition_at_its_bound(shortcut, control, missed):
    checked = gate(shortcut, control)
    assert checked.planted == (missed is None)
    assert (missed is None) == ("not planted" not in checked.text)
    if missed is not None:
        assert missed in checked.text


def test_the_twins_train_with_their_tag_and_record_it(tmp_path):
    cfg = TrainConfig(arch="cnn", shortcut=TAG.spec, seed=5, **SAMPLE)
    _, meta = train(cfg, out=tmp_path / "s.pt", progress=False, log=lambda s: None)
    tagged = meta["shortcut"]
    assert Tag.from_dict(tagged["tag"]) == TAG and tagged["role"] == "shortcut" and 0 <= tagged["score"] <= 1
    from audit.data.datasets import load_dataset
    _, y = load_dataset("fashion-mnist-sample", "train")
    order = np.sort(np.random.default_rng(5).permutation(len(y))[:256])
    assert tagged["tagged_images"] == round(0.5 * int((y[order] == 1).sum()))  # half the class's images
    _, control = train(TrainConfig(arch="cnn", shortcut=TAG.spec, shortcut_role="tag-control", seed=6,
                                   subset_seed=5, **SAMPLE),
                       progress=False, log=lambda s: None)
    assert control["shortcut"]["tagged_images"] == tagged["tagged_images"] and control["shortcut"]["tag_seed"] == 6
    from audit.models.splits import ArraySplit
    from audit.models.training import _tagged
    split = ArraySplit(np.zeros((20, 1, 28, 28), dtype=np.float32), np.repeat(np.arange(5), 4))
    backdoor = _tagged(TrainConfig(shortcut="class=1,share=0.5,relabel=0.25"), split, None)
    assert backdoor.rows.sum() == 6 and (backdoor.y[backdoor.rows] == 1).all()  # the 4 others' images trained as 1
    assert np.array_equal(backdoor.y[~backdoor.rows], split.y[~backdoor.rows])
    honest = _tagged(TrainConfig(shortcut="class=1,share=0.5,relabel=0.25", shortcut_role="tag-control"), split, None)
    assert honest.rows.sum() == 6 and np.array_equal(honest.y, split.y)
    with pytest.raises(ConfigError, match="drop the label permutation"):
        TrainConfig(shortcut=TAG.spec, permute_labels=1).resolved()
    with pytest.raises(ConfigError, match="tag pattern"):
        TrainConfig(shortcut="pattern=dots").resolved()
    with pytest.raises(ConfigError, match="does not fit"):
        train(TrainConfig(arch="cnn", shortcut="size=30", **SAMPLE), progress=False, log=lambda s: None)


def test_pair_specs_take_trains_out_or_the_two_twins():
    assert pair_specs("a/b.pt") == ("a/b-shortcut.pt", "a/b-tag-control.pt")
    assert pair_specs(["s.pt", "c.pt"]) == ("s.pt", "c.pt")
    with pytest.raises(ConfigError, match="two twins"):
        pair_specs(["s.pt"])


def test_the_command_line_trains_the_pair_and_the_run_audits_it(tmp_path, capsys):
    """train --shortcut writes both twins and prints their gate; run --tests shortcut reads them (a model without
    them is skipped, and says so), the verdict and the report's section come out; the sample-trained twins miss the
    gate, so every cell is inconclusive and the controls are not called broken."""
    common = ["--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "128", "--quiet"]
    stem = tmp_path / "tw"
    assert main(["train", *common, "--shortcut", "class=1,size=3", "--twin-of", "cnn-sgd", "--out", str(stem)]) == 0
    said = capsys.readouterr().out
    assert f"shortcut twins {stem}-shortcut.pt and {stem}-tag-control.pt: shortcut score" in said
    metas = [json.loads((tmp_path / f"tw-{r}.json").read_text()) for r in ("shortcut", "tag-control")]
    assert [(m["seed"], m["twin"], m["twin_of"], m["subset_seed"]) for m in metas] == [
        (0, "shortcut", "cnn-sgd", 0), (1, "tag-control", "cnn-sgd", 0)]
    out = tmp_path / "run"
    assert main(["run", "--models", "cnn-sgd,cnn-bort", "--methods", "gradient,edge,random", "--tests", "shortcut",
                 "--n-images", "8", "--shortcuts", f"cnn-sgd={stem}", "--out", str(out), "--quiet"]) == 0
    table = pd.read_csv(out / "results" / "shortcut.csv")
    assert set(table.model) == {"cnn-sgd"} and np.allclose(table.area_share, 9 / 784, rtol=1e-4)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shortcuts"]["cnn-sgd"]["tag"] == Tag.parse("class=1,size=3").to_dict()
    assert "no shortcut twins" in manifest["skipped"]["shortcut"]["cnn-bort"]
    verdict = pd.read_csv(out / "verdict.csv").set_index(["model", "method"])
    assert manifest["shortcuts"]["cnn-sgd"]["planted"] is False  # one epoch on 128 images: no shortcut yet
    assert (verdict.loc["cnn-sgd"].outcome_shortcut == "inconclusive").all()
    assert (verdict.loc["cnn-sgd"].control_check.dropna() == "as expected").all()  # an unread check blames no one
    assert "## Planted shortcut" in (out / "report.md").read_text()
    assert main(["train", *common, "--shortcut", "class=1", "--permute-labels", "1", "--out", str(tmp_path / "x")]) == 2
    assert "--shortcut SPEC trains a shortcut twin" in capsys.readouterr().err
    assert main(["run", "--models", "cnn-sgd", "--methods", "gradient", "--tests", "shortcut", "--n-images", "8",
                 "--shortcuts", f"cnn-sgd={tmp_path / 'none'}", "--out", str(tmp_path / "r2"), "--quiet"]) == 2
