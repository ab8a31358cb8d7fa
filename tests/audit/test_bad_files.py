"""Bad input through the command line, in files and in data, parametrised: every case is our own
error type (seen with --debug) naming the offending value, and a one-line message with exit code 2
without it (no traceback). The Python API's cases are in test_inputs.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from audit.cli import main
from audit.errors import ConfigError, DataError, ModelError
from audit.run.config import load_config
from audit.run.runner import run_audit
from tests.helpers import write_cifar_batches

RUN = ["run", "--methods", "gradient", "--tests", "random-logit", "--n-images", "2", "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A small finished run (its folder is copied and broken by the report cases)."""
    out = tmp_path_factory.mktemp("bad") / "run"
    run_audit(load_config(models=["cnn-sgd"], methods=["gradient"], tests=["random-logit", "cascading"], n_images=2,
                          heatmap_examples=1), out, progress=False, log=lambda s: None)
    return out


def _copy(finished: Path, tmp: Path) -> Path:
    out = tmp / "copy"
    shutil.copytree(finished, out)
    return out


def _manifest(edit):
    def setup(finished: Path, tmp: Path) -> list[str]:
        out = _copy(finished, tmp)
        path = out / "manifest.json"
        text = edit(json.loads(path.read_text()))
        path.write_text(text if isinstance(text, str) else json.dumps(text))
        return ["report", str(out)]
    return setup


BASE = {"models": '["cnn-sgd"]', "methods": '["gradient"]', "tests": '["random-logit"]', "n_images": "2"}


def _config(text: str):
    """A configuration file of the base keys and ``text`` (its keys replace the base's), the only source."""
    def setup(finished: Path, tmp: Path) -> list[str]:
        base = "".join(f"{k} = {v}\n" for k, v in BASE.items() if f"{k} =" not in text and f"[{k}]" not in text)
        (tmp / "audit.toml").write_text(base + text)
        return ["run", "--quiet", "--config", str(tmp / "audit.toml"), "--out", str(tmp / "o")]
    return setup


def _run(*args: str):
    def setup(finished: Path, tmp: Path) -> list[str]:
        return [*RUN, *(a.format(tmp=tmp) for a in args), "--out", str(tmp / "o")]
    return setup


def _file(name: str, content: bytes, *args: str):
    def setup(finished: Path, tmp: Path) -> list[str]:
        (tmp / name).write_bytes(content)
        return [a.format(tmp=tmp) for a in args]
    return setup


def _broken_unit_file(suffix: str, content: bytes):
    def setup(finished: Path, tmp: Path) -> list[str]:
        out = _copy(finished, tmp)
        target = out / "results" / "random_logit.csv" if suffix == ".csv" else \
            out / "units" / "cnn-sgd" / "cascading" / "gradient.npz"
        target.write_bytes(content)
        return ["report", str(out)]
    return setup


def _foreign_folder(finished: Path, tmp: Path) -> list[str]:
    (tmp / "o").mkdir()
    (tmp / "o" / "thesis.tex").write_text("mine")
    return [*RUN, "--models", "cnn-sgd", "--out", str(tmp / "o"), "--resume"]


def _out_is_file(finished: Path, tmp: Path) -> list[str]:
    (tmp / "o").write_text("x")
    return [*RUN, "--models", "cnn-sgd", "--out", str(tmp / "o")]


def _factory_module(body: str, spec: str, *extra: str):
    def setup(finished: Path, tmp: Path) -> list[str]:
        (tmp / "usermodels.py").write_text(body)
        return [*RUN, "--models", spec, *(a.format(tmp=tmp) for a in extra), "--out", str(tmp / "o")]
    return setup


def _checkpoint(state, **metadata):
    """A checkpoint m.pt holding ``state`` beside m.json with the shipped cnn's metadata, updated by ``metadata``."""
    def setup(finished: Path, tmp: Path) -> list[str]:
        import torch
        meta = {"arch": "cnn", "in_shape": [1, 28, 28], "num_classes": 10, **metadata}
        torch.save(state() if callable(state) else state, tmp / "m.pt")
        (tmp / "m.json").write_text(json.dumps(meta))
        return [*RUN, "--models", str(tmp / "m.pt"), "--out", str(tmp / "o")]
    return setup


def _cifar_of_text(finished: Path, tmp: Path) -> list[str]:
    import pickle

    import numpy as np
    folder = tmp / "c" / "cifar-10-batches-py"
    write_cifar_batches(folder, per_batch=2, seed=0)
    for batch in folder.iterdir():
        with open(batch, "wb") as f:
            pickle.dump({b"data": np.full((2, 3072), "x"), b"labels": ["cat", "dog"]}, f, protocol=2)
    return [*RUN, "--models", "cnn-sgd", "--data", "cifar10", "--data-root", str(tmp / "c"), "--out", str(tmp / "o")]


def _cnn_state():
    from audit.models import load_checkpoint
    return load_checkpoint("cnn-sgd").state_dict()


FACTORY = ("import torch\nfrom torch import nn\n"
           "def make():\n    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))\n"
           "def sized():\n    return nn.Sequential(nn.Flatten(), nn.Linear(100, 10))\n"
           "def strange():\n    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10), nn.Unflatten(1, (2, 5)))\n"
           "NOT_A_FACTORY = 3\n")

CASES = {
    # the report of a run: manifests and result files
    "report of a folder without a run": (lambda f, t: ["report", str(t)], ConfigError, "no manifest.json"),
    "manifest not JSON": (_manifest(lambda m: "{not json"), ConfigError, "not JSON"),
    "manifest a JSON list": (_manifest(lambda m: [1, 2]), ConfigError, "not a manifest of an audit run"),
    "manifest without configuration": (_manifest(lambda m: {"status": "complete"}), ConfigError,
                                       "no configuration table"),
    "manifest of an unfinished run": (_manifest(lambda m: {**m, "status": "running"}), ConfigError, "did not finish"),
    "manifest with an unknown key": (_manifest(lambda m: {**m, "config": {**m["config"], "colour": 1}}), ConfigError,
                                     "unknown configuration key 'colour'"),
    "manifest with a mistyped value": (_manifest(lambda m: {**m, "config": {**m["config"], "seed": "zero"}}),
                                       ConfigError, "seed.*'zero'"),
    "results table not a CSV": (_broken_unit_file(".csv", b"\x00\xff\xfe garbage \x00" * 50), ConfigError,
                                "random_logit.csv is not a results table"),
    "example maps not an npz": (_broken_unit_file(".npz", b"PK\x03\x04 broken zip"), ConfigError,
                                "gradient.npz is not example maps"),
    # configuration files
    "config not TOML": (_config("models = [cnn-sgd\n"), ConfigError, "audit.toml"),
    "config seed as text": (_config('seed = "7"\n'), ConfigError, "seed.*'7'"),
    "config negative seed": (_config("seed = -3\n"), ConfigError, "seed.*-3"),
    "config table for a list": (_config("[methods]\ngradient = true\n"), ConfigError, "methods"),
    "config fractional n_images": (_config("n_images = 2.5\n"), ConfigError, "n_images.*2.5"),
    "config unknown key": (_config("n_imagse = 4\n"), ConfigError, "n_imagse.*n_images"),
    "config file missing": (lambda f, t: [*RUN, "--models", "cnn-sgd", "--config", str(t / "none.toml"), "--out",
                                          str(t / "o")], ConfigError, "none.toml"),
    # command-line values
    "duplicate models": (_run("--models", "cnn-sgd,cnn-sgd"), ConfigError, "cnn-sgd"),
    "unknown model": (_run("--models", "cnn-sgdd"), ModelError, "cnn-sgdd"),
    "unknown data set": (_run("--models", "cnn-sgd", "--data", "imagenette"), DataError, "imagenette"),
    "too few images": (_run("--models", "cnn-sgd", "--n-images", "1"), ConfigError, "n_images.*1"),
    "more images than the data has": (_run("--models", "cnn-sgd", "--n-images", "5000"), DataError, "5000"),
    "data root missing": (_run("--models", "cnn-sgd", "--data", "fashion-mnist", "--data-root", "{tmp}/nowhere"),
                          DataError, "nowhere"),
    "unknown preprocessing preset": (_run("--models", "cnn-sgd", "--preprocess", "imagenett"), ConfigError,
                                     "imagenett"),
    "image folder without a root": (_run("--models", "cnn-sgd", "--data", "imagefolder"), ConfigError, "data_root"),
    "image folder that is empty": (_run("--models", "cnn-sgd", "--data", "imagefolder", "--data-root", "{tmp}"),
                                   DataError, "no images found"),
    "out is a file": (_out_is_file, ConfigError, "is a file"),
    "resume into a foreign folder": (_foreign_folder, ConfigError, "manifest.json"),
    # model files and factories
    "checkpoint not a torch file": (_file("m.pt", b"not a checkpoint", *RUN, "--models", "{tmp}/m.pt", "--out",
                                          "{tmp}/o"), ModelError, "m.pt"),
    "checkpoint holding a bare tensor": (_checkpoint(lambda: __import__("torch").zeros(3)), ModelError,
                                         "m.pt: holds a Tensor, not a state_dict"),
    "checkpoint option of the wrong type": (_checkpoint(_cnn_state, arch="vgg", arch_options={"dropout": "high"}),
                                            ModelError, r"m.json: cannot build 'vgg' from its metadata.*dropout"),
    "checkpoint options not a table": (_checkpoint(_cnn_state, arch_options=[1]), ModelError,
                                       r"m.json: .*arch_options a table, got .*\[1\]"),
    "checkpoint path a folder": (lambda f, t: (t / "folder.pt").mkdir() or [*RUN, "--models", str(t / "folder.pt"),
                                                                            "--out", str(t / "o")],
                                 ModelError, "folder.pt is a folder"),
    "data file of text, not numbers": (_cifar_of_text, DataError, "test_batch: CIFAR batch 'data' holds <U1 values"),
    "checkpoint path missing": (_run("--models", "{tmp}/missing.pt"), ModelError, "missing.pt"),
    "weights file missing": (_factory_module(FACTORY, "usermodels:make", "--weights", "{tmp}/w.pt"), ModelError,
                             "w.pt"),
    "weights not a state_dict": (_factory_module(FACTORY, "usermodels:make", "--weights", "{tmp}/usermodels.py"),
                                 ModelError, "usermodels.py"),
    "factory not callable": (_factory_module(FACTORY, "usermodels:NOT_A_FACTORY"), ModelError, "NOT_A_FACTORY"),
    "factory missing": (_factory_module(FACTORY, "usermodels:build"), ModelError, "usermodels:build"),
    "model for other inputs": (_factory_module(FACTORY, "usermodels:sized"), ModelError, r"\(2, 1, 28, 28\)"),
    "model output not (B, classes)": (_factory_module(FACTORY, "usermodels:strange"), ModelError, r"\(2, 2, 5\)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_file_or_argument_gets_our_error_naming_it(case, finished, tmp_path, monkeypatch, capsys):
    setup, error, message = CASES[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = setup(finished, tmp_path)
    with pytest.raises(error, match=message):
        main(["--debug", *argv])
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "error:" in err, err
