"""The pattern methods in an audit: patterns fitted on a named split, kept beside the checkpoint with the
weights' fingerprint, read again by the next run, refitted for every randomized model, recorded."""
import shutil

import pytest
import torch

from attributions import patterns as P
from audit.data import embedded_sample
from audit.errors import ConfigError
from audit.models.checkpoint import SHIPPED, load_checkpoint, resolve_model
from audit.run.config import load_config
from audit.run.patterns import pattern_images, pattern_source
from audit.run.runner import run_audit
from reports.methods_text import paragraphs


def test_what_pattern_data_names():
    assert pattern_source("explained", "embedded") is None
    assert pattern_source("train", "embedded") == ("fashion-mnist-sample", "train")
    assert pattern_source("train", "cifar10") == ("cifar10", "train")
    assert pattern_source("mnist:test", "embedded") == ("mnist", "test")
    for bad, data in [("training", "embedded"), ("imagefolder:train", "embedded"), ("mnist:val", "embedded"),
                      ("train", "imagefolder")]:
        with pytest.raises(ConfigError, match="pattern_data"):
            pattern_source(bad, data)
    with pytest.raises(ConfigError, match="pattern_data"):
        load_config(methods=["patternnet"], pattern_data="trian").validated()
    with pytest.raises(ConfigError, match="pattern_images"):
        load_config(methods=["patternnet"], pattern_images=0).validated()
    images, what = pattern_images("train", "embedded", 12, seed=3)
    again, _ = pattern_images("train", "embedded", 12, seed=3)
    assert images.shape == (12, 1, 28, 28) and torch.equal(images, again) and "train split of fashion-mnist-sample" in what
    assert not torch.equal(images, pattern_images("train", "embedded", 12, seed=4)[0])
    with pytest.raises(ConfigError, match="holds 800 images"):
        pattern_images("train", "embedded", 801, seed=0)


def test_an_audit_fits_the_trained_patterns_once_beside_the_checkpoint_and_refits_each_stage(tmp_path, monkeypatch):
    for suffix in (".pt", ".json"):
        shutil.copy(SHIPPED / f"cnn-sgd{suffix}", tmp_path / f"cnn{suffix}")
    fits = []
    real = P.fit_nodes
    monkeypatch.setattr(P, "fit_nodes", lambda ex, data, *a, **k: fits.append(len(data)) or real(ex, data, *a, **k))
    quiet = {"progress": False, "log": lambda s: None}
    config = load_config(models=[str(tmp_path / "cnn.pt")], methods=["patternattribution"],
                         tests=["random-logit", "cascading"], n_images=3, pattern_data="train", pattern_images=40)
    first = run_audit(config, tmp_path / "run", **quiet)
    trained = P.fingerprint(resolve_model(str(tmp_path / "cnn.pt")))
    record = first.manifest["patterns"]
    assert record["n"] == 40 and "40 images of the train split of fashion-mnist-sample" in record["data"]
    kept = tmp_path / record["files"]["cnn"]
    assert kept.parent == tmp_path and trained[:16] in kept.name  # beside the checkpoint, named by its weights
    saved = P.Patterns.load(kept)
    assert saved.fingerprint == trained and saved.n == 40
    # the trained model fitted once (then read from the file), each randomized stage of each re-initialisation
    # seed on its own (3 images: two seeds), all on the 40
    stages = int(first.tables["cascading"].stage.max())
    seeds = first.tables["cascading"].replicate.nunique()
    assert fits == [40] * (1 + seeds * stages) and stages >= 1 and seeds == 2
    fits.clear()
    second = run_audit(config, tmp_path / "again", **quiet)
    assert fits == [40] * seeds * stages  # the trained model's patterns read from the file
    for test in ("random-logit", "cascading"):
        assert first.tables[test].drop(columns="seconds", errors="ignore").equals(
            second.tables[test].drop(columns="seconds", errors="ignore"))
    text = " ".join(t for _, t in paragraphs(second.manifest, second.tables["models"]))
    assert "40 images of the train split of fashion-mnist-sample" in text and "fit them again, on the same images" in text
    explained = run_audit(load_config(**{**config.to_dict(), "pattern_data": "explained"}), tmp_path / "own", **quiet)
    assert "patterns" not in explained.manifest
    assert not explained.tables["random-logit"].ssim.equals(first.tables["random-logit"].ssim)


def test_the_shipped_checkpoints_folder_stays_as_shipped(tmp_path):
    from audit.run.patterns import cache_file

    before = sorted(p.name for p in SHIPPED.iterdir())
    path = cache_file("cnn-sgd", None, "cnn-sgd", "train", torch.zeros(8, 1, 28, 28), "f" * 64, out=tmp_path)
    assert path.parent == tmp_path / "patterns" and sorted(p.name for p in SHIPPED.iterdir()) == before
    # other images (another seed's draw, another split) never share a file
    assert cache_file("cnn-sgd", None, "cnn-sgd", "train", torch.ones(8, 1, 28, 28), "f" * 64, out=tmp_path) != path


def test_a_damaged_patterns_cache_is_named_and_a_cache_of_other_images_is_not_read(tmp_path):
    from attributions import Explainer
    from attributions.errors import AttributionError
    from attributions.patterns import Patterns, fingerprint

    model = load_checkpoint("cnn-sgd")
    x, y = embedded_sample()
    data, images = torch.from_numpy(x[:16]), torch.from_numpy(x[16:20])
    cache = tmp_path / "p.pt"
    params = dict(data=data, cache=cache, cache_for=fingerprint(model), source="16 images (seed 0)")
    first = Explainer(model, "patternnet", **params).attribute(images, target=torch.from_numpy(y[16:20]))
    saved = Patterns.load(cache)
    # the same file recorded for other images (another seed): refitted, not read
    other = Explainer(model, "patternnet", **{**params, "source": "16 images (seed 1)"})
    assert torch.equal(other.attribute(images, target=torch.from_numpy(y[16:20])), first)  # fitted anew, alike
    assert Patterns.load(cache).source == "16 images (seed 1)"
    Patterns({k: v * float("nan") for k, v in saved.patterns.items()}, saved.estimator, saved.n, "16 images (seed 1)",
             saved.fingerprint).save(cache)
    with pytest.raises(AttributionError, match=f"{cache}.*not finite.*delete it"):
        Explainer(model, "patternnet", **{**params, "source": "16 images (seed 1)"}).attribute(images, target=0)
    cache.write_bytes(b"not a patterns file")
    with pytest.raises(AttributionError, match=f"{cache} is not a patterns file"):
        Explainer(model, "patternnet", **params).attribute(images, target=0)
