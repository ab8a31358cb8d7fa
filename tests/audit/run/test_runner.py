"""The runner: resume after a kill, user models left unchanged."""
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import audit.run.execute
from audit.cli import main
from audit.errors import ConfigError
from audit.faults import KILL_AFTER_UNITS
from audit.run.config import load_config
from audit.run.folder import exclusive
from audit.run.runner import run_audit


def _results(out: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted((out / "results").glob("*.csv"))}


# the tables are compared, not the report (the report's resume: tests/audit/test_faults.py)
ARGS = ["--models", "cnn-sgd", "--methods", "gradient,lrp-zplus,deeplift,lrp-epsilon,edge",
        "--tests", "random-logit,cascading", "--n-images", "4", "--quiet", "--no-report"]
ROOT = Path(__file__).resolve().parents[3]


def _tables(out: Path) -> dict[str, bytes]:
    """The run's tables: joined results and every unit."""
    return {str(p.relative_to(out)): p.read_bytes()
            for p in sorted([*(out / "results").glob("*.csv"), *(out / "units").rglob("*.csv")])}


def _killed_run(out: Path, after: int, **env: str) -> subprocess.CompletedProcess:
    """``attribution-audit run ARGS`` in a subprocess that kills itself after its ``after``-th unit file."""
    env = {**os.environ, KILL_AFTER_UNITS: str(after), "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run([sys.executable, "-m", "audit", "run", *ARGS, "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert len(list((out / "units").rglob("*.csv"))) == after and not (out / "results").exists()
    return done


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, bytes]:
    """The tables of an uninterrupted run of ARGS with one intra-op thread. (A kill at a write, then a resume
    with the default threads: tests/audit/test_faults.py.)"""
    out = tmp_path_factory.mktemp("uninterrupted") / "1"
    with _threads(1):
        assert main(["run", *ARGS, "--out", str(out)]) == 0
    assert not (out / ".lock").exists()  # the lock lives as long as the run holds it
    return _tables(out)


def test_resume_computes_with_the_threads_the_run_started_with(uninterrupted, tmp_path, capsys, monkeypatch):
    killed = tmp_path / "killed"
    _killed_run(killed, 4, OMP_NUM_THREADS="1")
    assert json.loads((killed / "manifest.json").read_text())["threads_per_process"] == 1
    seen, real = [], audit.run.execute.run_unit
    monkeypatch.setattr(audit.run.execute, "run_unit", lambda *a, **k: seen.append(torch.get_num_threads()) or real(*a, **k))
    with _threads(2):
        assert main(["run", *ARGS, "--out", str(killed), "--resume"]) == 0
        assert torch.get_num_threads() == 2  # restored after the run
    assert seen == [1] * 6  # the six units left, each computed with the run's one thread
    assert "computing with 1 intra-op thread per process, as the run was started (this process has 2)" \
        in capsys.readouterr().out
    assert _tables(killed) == uninterrupted


def test_resume_refuses_a_run_started_with_other_software(tmp_path):
    killed = tmp_path / "killed"
    _killed_run(killed, 2)
    manifest = json.loads((killed / "manifest.json").read_text())
    manifest["versions"]["torch"] = "1.0.0"
    (killed / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=rf"started with other software \(torch 1.0.0 -> {re.escape(torch.__version__)}\)"):
        main(["--debug", "run", *ARGS, "--out", str(killed), "--resume"])


def test_user_model_from_a_factory_and_a_checkpoint_file_left_unchanged(tmp_path, monkeypatch):
    from audit.models import build, save_checkpoint

    path = save_checkpoint(build("cnn"), {"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10},
                           tmp_path / "mine.pt")
    (tmp_path / "mymodels.py").write_text("from audit.models import build\n\ndef make():\n    return build('cnn')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    config = load_config(models=[str(path), "mymodels:make"], weights=None, methods=["gradient", "lrp-zplus"],
                         tests=["random-logit"], n_images=2)
    result = run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    assert set(result.tables["random-logit"].model) == {"mine", "mymodels_make"}
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest



def test_two_models_with_one_label_and_too_many_images_are_refused(tmp_path):
    import pytest

    from audit.errors import ConfigError, DataError
    from audit.models import build, save_checkpoint

    meta = {"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10}
    a = save_checkpoint(build("cnn"), meta, tmp_path / "a" / "net.pt")
    b = save_checkpoint(build("cnn"), meta, tmp_path / "b" / "net.pt")
    config = load_config(models=[str(a), str(b)], methods=["gradient"], tests=["random-logit"], n_images=2)
    with pytest.raises(ConfigError, match="two models share the label 'net'"):
        run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    config = load_config(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit"], n_images=5000)
    with pytest.raises(DataError, match="5000 images asked for, but the embedded test data hold 1000"):
        run_audit(config, tmp_path / "run2", progress=False, log=lambda s: None)


def test_resume_refuses_foreign_folders_and_changed_inputs(tmp_path):
    import json

    import pytest

    from audit.errors import ConfigError, DataError
    from audit.models import build, save_checkpoint

    meta = {"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10}
    path = save_checkpoint(build("cnn"), meta, tmp_path / "mine.pt")
    config = load_config(models=[str(path)], methods=["gradient"], tests=["random-logit"], n_images=2)
    quiet = {"progress": False, "log": lambda s: None}

    foreign = tmp_path / "site"
    foreign.mkdir()
    (foreign / "index.html").write_text("<p>someone's page</p>")
    with pytest.raises(ConfigError, match="holds no audit run.*resume only continues"):
        run_audit(config, foreign, resume=True, **quiet)
    assert (foreign / "index.html").read_text() == "<p>someone's page</p>" and len(list(foreign.iterdir())) == 1

    run = tmp_path / "run"
    run_audit(config, run, **quiet)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["fingerprints"]["files"][str(path)] == hashlib.sha256(path.read_bytes()).hexdigest()
    run_audit(config, run, resume=True, **quiet)  # nothing changed: resumes (every unit done)
    with exclusive(run), pytest.raises(ConfigError, match="another audit run is writing to"):
        run_audit(config, run, resume=True, **quiet)  # as a second process would find it
    save_checkpoint(build("cnn", num_classes=10), meta, path)  # another model under the same file name
    with pytest.raises(ConfigError, match=r"mine.pt changed since the run .* started"):
        run_audit(config, run, resume=True, **quiet)
    # as if the images had been different (the model files left out of the comparison)
    (run / "manifest.json").write_text(json.dumps({**manifest, "fingerprints": {"data": "0" * 64}}))
    with pytest.raises(ConfigError, match="audited images differ"):
        run_audit(config, run, resume=True, **quiet)

    refused = tmp_path / "refused"
    with pytest.raises(DataError, match="5000 images asked for"):
        run_audit(load_config(models=[str(path)], methods=["gradient"], tests=["random-logit"], n_images=5000),
                  refused, **quiet)
    assert not refused.exists()  # a run refused before its first unit leaves nothing that blocks a rerun


def test_an_image_folder_with_your_model_and_preprocessing(tmp_path, monkeypatch):
    """A class-per-folder tree of RGB files of different sizes, a module:factory model taking
    3 x 32 x 32, a preprocessing table: the run records the drawn files and the preprocessing, and
    the report draws the input as it looked (normalisation undone)."""
    import json

    import numpy as np
    from PIL import Image

    from audit.data.preprocess import preprocess_from
    from reports import build_report

    rng = np.random.default_rng(0)
    for c in ("ant", "bee", "cow"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            h, w = rng.integers(36, 60, 2)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "imgs" / c / f"{i}.jpg")
    (tmp_path / "tiny.py").write_text(
        "from torch import nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),\n"
        "                         nn.Linear(4 * 8 * 8, 3))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = {"resize": 40, "crop": 32, "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}
    config = load_config(models=["tiny:make"], methods=["gradient", "lrp-zplus"], tests=["random-logit", "cascading"],
                         data="imagefolder", data_root=str(tmp_path / "imgs"), preprocess=spec, n_images=5,
                         heatmap_examples=1, seed=3)
    result = run_audit(config, tmp_path / "out", progress=False, log=lambda s: None)
    images = json.loads((tmp_path / "out" / "manifest.json").read_text())["images"]
    assert images["classes"] == ["ant", "bee", "cow"] and len(images["files"]) == 5
    assert images["labels"] == [0, 1, 2, 0, 1] and images["preprocess"] == spec
    assert [f.split("/")[0] for f in images["files"]] == ["ant", "bee", "cow", "ant", "bee"]
    assert set(result.tables["random-logit"].model) == {"tiny_make"}  # the label: a file-name-safe spec
    build_report(tmp_path / "out")
    methods = (tmp_path / "out" / "methods.md").read_text()
    assert "stratified by class with seed 3" in methods and "centre crop of 32 px" in methods
    with np.load(next((tmp_path / "out" / "units").rglob("*.npz"))) as npz:
        shown = preprocess_from(spec).picture(npz["images"][0])
    original = np.asarray(Image.open(tmp_path / "imgs" / images["files"][0]).convert("RGB"), dtype=np.float32)
    assert shown.shape == (3, 32, 32) and 0 <= shown.min() and shown.max() <= 1
    assert abs(float(shown.mean()) - float(original.mean()) / 255) < 0.05  # the picture, not the normalised input


def test_each_unit_line_says_how_much_is_left(tmp_path):
    lines = []
    run_audit(load_config(models=["cnn-sgd"], methods=["gradient", "edge"], tests=["random-logit"], n_images=2),
              tmp_path / "r", progress=False, log=lines.append)
    assert "; 1 unit left, about " in lines[0] and lines[1].endswith("; 0 units left)")


def test_the_layer_grad_cam_weighs_on_each_model_is_in_the_manifest_and_the_methods_text(tmp_path):
    from reports import methods_text

    config = load_config(models=["cnn-sgd", "resnet-sgd"], methods=["grad-cam", "guided-grad-cam", "gradient",
                                                                    "attention-rollout"],
                         tests=["random-logit", "csc"], n_images=2)
    result = run_audit(config, tmp_path / "r", progress=False, log=lambda s: None)
    chosen = result.manifest["conventions"]
    assert set(chosen) == {"grad-cam", "guided-grad-cam"}  # the gradient has nothing to choose
    assert chosen["grad-cam"]["resnet-sgd"] == {"layer": "layer3.2.relu2", "module": "layer3.2.relu2", "relu": True,
                                                "upsample": "bilinear", "normalise": "none"}
    assert chosen["grad-cam"]["cnn-sgd"]["layer"] == "features.10"
    text = dict(methods_text.paragraphs(result.manifest, result.tables["models"]))["Attribution methods"]
    assert "layer weighed: features.10 on cnn-sgd, layer3.2.relu2 on resnet-sgd" in text
    table = result.tables["random-logit"]
    assert len(table) == 12 and table[table.method == "gradient"].ssim.notna().all()
    # attention rollout fits neither CNN: its units are empty and the manifest and the methods text say why
    assert set(result.manifest["not_applicable"]["attention-rollout"]) == {"cnn-sgd", "resnet-sgd"}
    assert "no attention layer" in result.manifest["not_applicable"]["attention-rollout"]["cnn-sgd"]
    assert "attention-rollout" not in set(table.method) and "attention-rollout" not in set(result.tables["csc"].method)
    assert "not applicable to cnn-sgd, resnet-sgd" in text


def test_an_imagenet_size_model_with_torchvision_keys_end_to_end(tmp_path, monkeypatch):
    """ResNet-50 at 224 x 224 built by the user's factory, weights from a state_dict file with
    torchvision's keys, ImageNet preprocessing of JPEG files: the run uses those weights (its logits are
    the file's model's) and finishes under a memory budget."""
    import json

    import numpy as np
    import torch
    from PIL import Image

    from audit.data.preprocess import preprocess_from
    from audit.models import build

    rng = np.random.default_rng(1)
    for c in ("n01440764", "n01443537"):
        (tmp_path / "val" / c).mkdir(parents=True)
        for i in range(2):
            h, w = rng.integers(240, 320, 2)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "val" / c / f"{i}.JPEG")
    (tmp_path / "zoo_factory.py").write_text("from audit.models import build\n\n"
                                             "def resnet50():\n    return build('resnet50', (3, 224, 224), 1000)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.manual_seed(7)
    trained = build("resnet50", (3, 224, 224), 1000).eval()
    with torch.no_grad():  # non-default statistics, so that a model left at its initialisation would differ
        for m in trained.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    state = trained.state_dict()
    assert "layer4.2.bn3.num_batches_tracked" in state and "fc.weight" in state  # torchvision's layout
    torch.save(state, tmp_path / "resnet50.pth")
    config = load_config(models=["zoo_factory:resnet50"], weights=str(tmp_path / "resnet50.pth"),
                         methods=["gradient", "lrp-epsilon-plus"], tests=["random-logit"], data="imagefolder",
                         data_root=str(tmp_path / "val"), preprocess="imagenet", n_images=2, max_memory="2GB")
    result = run_audit(config, tmp_path / "out", progress=False, log=lambda s: None)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["memory"]["budget_bytes"] == 2 * 2**30
    assert str(tmp_path / "resnet50.pth") in manifest["fingerprints"]["files"]
    table = result.tables["random-logit"]
    assert len(table) == 4 and np.isfinite(table.ssim).all()
    # the audited model is the file's: its scores are those of the model the weights were saved from
    from audit.checks.random_logit import random_logit_test
    from audit.data.datasets import sample_image_folder
    sample = sample_image_folder(str(tmp_path / "val"), 2, 0, "imagenet")
    assert sample.x.shape == (2, 3, 224, 224) and preprocess_from("imagenet").crop == 224
    direct = random_logit_test(trained, torch.from_numpy(sample.x), torch.from_numpy(sample.y),
                               ["gradient", "lrp-epsilon-plus"], seed=0, progress=False)
    assert np.allclose(table.ssim.to_numpy(), direct.ssim.to_numpy(), atol=1e-6)
    untrained = random_logit_test(build("resnet50", (3, 224, 224), 1000).eval(), torch.from_numpy(sample.x),
                                  torch.from_numpy(sample.y), ["gradient"], seed=0, progress=False)
    assert not np.allclose(table.ssim.to_numpy()[:2], untrained.ssim.to_numpy(), atol=1e-3)


def test_blocks_of_images_give_the_units_of_one_pass_and_resume(tmp_path, monkeypatch):
    """A unit computed in blocks of images equals the whole unit where nothing random depends on the
    block (cascading randomization of the gradient); a run failing part way through the blocks
    finishes, after --resume, with the files of an uninterrupted one."""
    import numpy as np
    import pytest

    import audit.run.execute
    import audit.run.plan

    base = dict(models=["cnn-sgd"], methods=["gradient"], tests=["cascading"], n_images=5, heatmap_examples=3)
    whole = run_audit(load_config(**base), tmp_path / "whole", progress=False, log=lambda s: None)
    blocked = run_audit(load_config(**base, image_block=2), tmp_path / "blocked", progress=False, log=lambda s: None)
    a, b = whole.tables["cascading"], blocked.tables["cascading"]
    assert a[["stage", "layer", "image"]].equals(b[["stage", "layer", "image"]])
    assert np.allclose(a.ssim, b.ssim, atol=1e-5) and np.allclose(a.spearman, b.spearman, atol=1e-5)
    with np.load(tmp_path / "whole/units/cnn-sgd/cascading/gradient.npz") as u, \
            np.load(tmp_path / "blocked/units/cnn-sgd/cascading/gradient.npz") as v:
        assert u["maps"].shape == v["maps"].shape and np.allclose(u["maps"], v["maps"], atol=1e-5 * abs(u["maps"]).max())
        assert np.array_equal(u["images"], v["images"])
    assert blocked.manifest["timings_s"].keys() == {"cnn-sgd/cascading/gradient@0-2", "cnn-sgd/cascading/gradient@2-4",
                                                    "cnn-sgd/cascading/gradient@4-5"}

    config = load_config(**{**base, "methods": ["gradient", "lrp-zplus"]}, image_block=2)
    writes = []
    real = audit.run.execute.atomic_write_bytes

    def failing(path, data):
        writes.append(path)
        if len(writes) == 6:  # part way through the second unit's blocks
            raise OSError("disk full")
        real(path, data)

    for module in (audit.run.plan, audit.run.execute):  # the "running" manifest, then the units' files
        monkeypatch.setattr(module, "atomic_write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        run_audit(config, tmp_path / "failed", progress=False, log=lambda s: None)
    for module in (audit.run.plan, audit.run.execute):
        monkeypatch.setattr(module, "atomic_write_bytes", real)
    assert list((tmp_path / "failed" / "units").rglob("*@*.csv"))  # blocks done before the failure are kept
    run_audit(config, tmp_path / "failed", resume=True, progress=False, log=lambda s: None)
    fresh = run_audit(config, tmp_path / "fresh", progress=False, log=lambda s: None)
    assert not list((tmp_path / "failed").rglob("*@*"))
    for name in ("gradient", "lrp-zplus"):
        unit = f"units/cnn-sgd/cascading/{name}.csv"
        assert (tmp_path / "failed" / unit).read_bytes() == (tmp_path / "fresh" / unit).read_bytes()
    assert _results(tmp_path / "failed") == _results(tmp_path / "fresh") and len(fresh.tables["cascading"])
