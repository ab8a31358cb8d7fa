"""The trainer: seeded, deterministic, resumable per epoch, optimizer registry, CLI."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from audit.cli import main
from audit.errors import ConfigError
from audit.models import load_checkpoint
from audit.models.training import OPTIMIZERS, TrainConfig, train

SAMPLE = dict(data="fashion-mnist-sample", train_limit=256, batch_size=32)


def _quiet(config, **kw):
    return train(config, progress=False, log=lambda s: None, **kw)


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_same_seed_same_weights_bit_for_bit():
    a, meta_a = _quiet(TrainConfig(arch="cnn", epochs=1, seed=3, **SAMPLE))
    b, meta_b = _quiet(TrainConfig(arch="cnn", epochs=1, seed=3, **SAMPLE))
    c, _ = _quiet(TrainConfig(arch="cnn", epochs=1, seed=4, **SAMPLE))
    assert _same_weights(a, b)
    assert not _same_weights(a, c)
    assert meta_a["data"]["sha256"] == meta_b["data"]["sha256"]


def test_metadata_and_checkpoint(tmp_path):
    model, meta = _quiet(TrainConfig(arch="vgg", optimizer="adamw", epochs=2, seed=0,
                                     arch_options={"batch_norm": True}, **SAMPLE), out=tmp_path / "v.pt")
    on_disk = json.loads((tmp_path / "v.json").read_text())
    assert on_disk == json.loads(json.dumps(meta))
    assert meta["arch"] == "vgg" and meta["arch_options"] == {"batch_norm": True}
    assert meta["optimizer"] == "adamw" and meta["hyperparameters"]["lr"] == OPTIMIZERS["adamw"].lr
    assert meta["hyperparameters"]["batch_size"] == 32 and meta["epochs"] == 2 and meta["seed"] == 0
    assert meta["data"]["train_size"] == 256 and meta["data"]["test_size"] == 200
    assert len(meta["data"]["sha256"]) == 64 and meta["torch_version"] == torch.__version__
    assert [h["epoch"] for h in meta["history"]] == [1, 2] and meta["wall_time_s"] > 0
    assert 0.0 <= meta["test_accuracy"] <= 1.0
    loaded = load_checkpoint(tmp_path / "v.pt")
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert not (tmp_path / "v.resume.pt").exists()


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    config = TrainConfig(arch="cnn", epochs=3, seed=2, **SAMPLE)
    full, _ = _quiet(config, out=tmp_path / "full.pt")

    def crash_after_first_epoch(line):
        if line.startswith("epoch 1/3"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, out=tmp_path / "part.pt", progress=False, log=crash_after_first_epoch)
    assert (tmp_path / "part.resume.pt").exists() and not (tmp_path / "part.pt").exists()
    resumed, meta = _quiet(config, out=tmp_path / "part.pt", resume=True)
    assert _same_weights(full, resumed)
    assert [h["epoch"] for h in meta["history"]] == [1, 2, 3]


def test_bad_training_config():
    with pytest.raises(ConfigError, match="unknown optimizer 'sdg'.*valid: adamw, .*sgd"):
        TrainConfig(optimizer="sdg").resolved()
    for bad in [dict(lr=-1.0), dict(lr=float("nan")), dict(epochs=0), dict(batch_size=0), dict(momentum=1.0),
                dict(weight_decay=-0.1), dict(train_limit=0)]:
        with pytest.raises(ConfigError, match="invalid"):
            TrainConfig(**bad).resolved()


def test_cli_train_and_errors(tmp_path, capsys):
    rc = main(["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "64",
               "--out", str(tmp_path / "c.pt"), "--quiet"])
    assert rc == 0 and (tmp_path / "c.json").exists()
    assert main(["train", "--optimizer", "rmsprop", "--out", str(tmp_path / "x.pt")]) == 2
    assert "unknown optimizer 'rmsprop'" in capsys.readouterr().err
    assert main(["train", "--data", "svhn", "--out", str(tmp_path / "x.pt")]) == 2
    assert "unknown data set 'svhn'" in capsys.readouterr().err
    assert main(["models"]) == 0
    assert "resnet50" in capsys.readouterr().out


def test_one_epoch_on_5000_fashion_mnist_images(full_fashion_mnist, tmp_path, capsys):
    """The foundation's acceptance run: >= 75 % test accuracy on the full 10,000-image test split."""
    rc = main(["train", "--arch", "cnn", "--optimizer", "sgd", "--epochs", "1", "--train-limit", "5000",
               "--out", str(tmp_path / "cnn.pt"), "--quiet"])
    assert rc == 0
    meta = json.loads((tmp_path / "cnn.json").read_text())
    assert meta["data"]["test_size"] == 10000 and meta["data"]["train_size"] == 5000
    assert meta["test_accuracy"] >= 0.75, meta["test_accuracy"]


def test_cli_bort_options_are_recorded(tmp_path):
    rc = main(["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "64",
               "--optimizer", "bort", "--gamma", "0.1", "--amplitude", "adaptive", "--bort-mode", "l2-full",
               "--dbort", "--out", str(tmp_path / "b.pt"), "--quiet"])
    assert rc == 0
    meta = json.loads((tmp_path / "b.json").read_text())
    assert meta["optimizer"] == "bort" and meta["hyperparameters"]["dbort"] is True
    assert meta["hyperparameters"]["options"] == {"gamma": 0.1, "amplitude": "adaptive", "mode": "l2-full"}


def test_bort_options_bad_input(tmp_path, capsys):
    base = ["train", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "32", "--quiet",
            "--out", str(tmp_path / "x.pt")]
    assert main(base + ["--gamma", "0.1"]) == 2
    assert "need --optimizer bort" in capsys.readouterr().err
    assert main(base + ["--optimizer", "bort", "--gamma", "-1"]) == 2
    assert "gamma must be finite, >= 0" in capsys.readouterr().err
    assert main(base + ["--optimizer", "bort-adamw", "--bort-mode", "l1-full"]) == 2
    assert "unknown Bort mode 'l1-full'" in capsys.readouterr().err
    assert main(base + ["--optimizer", "bort", "--amplitude", "big"]) == 2
    assert "expected a number or 'adaptive'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown Bort option"):
        _quiet(TrainConfig(optimizer="bort", options={"gama": 0.1}, **SAMPLE))


class _Planted:
    """Pickles as a call that touches a marker file: loading it must never run that call."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_planted_resume_state_cannot_run_code(tmp_path):
    torch.save({"model": _Planted(tmp_path / "pwned"), "epoch": 1}, tmp_path / "part.resume.pt")
    with pytest.raises(ConfigError, match="not a resume state written by the trainer"):
        _quiet(TrainConfig(arch="cnn", epochs=2, seed=0, **SAMPLE), out=tmp_path / "part.pt", resume=True)
    assert not (tmp_path / "pwned").exists()


def test_bort_resume_state_loads_without_pickled_code(tmp_path):
    # the Bort optimizer's state and the scheduler's go through the weights-only loader too
    config = TrainConfig(arch="cnn", optimizer="bort", epochs=2, seed=1, **SAMPLE)

    def crash(line):
        if line.startswith("epoch 1/2"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(config, out=tmp_path / "b.pt", progress=False, log=crash)
    resumed, meta = _quiet(config, out=tmp_path / "b.pt", resume=True)
    full, _ = _quiet(config, out=tmp_path / "full.pt")
    assert _same_weights(full, resumed) and [h["epoch"] for h in meta["history"]] == [1, 2]


def test_an_existing_checkpoint_is_not_overwritten_without_force(tmp_path):
    config = TrainConfig(arch="cnn", epochs=1, seed=0, **SAMPLE)
    _quiet(config, out=tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    with pytest.raises(ConfigError, match=r"m.pt exists; pass force=True \(--force\)"):
        _quiet(TrainConfig(arch="cnn", epochs=1, seed=1, **SAMPLE), out=tmp_path / "m.pt")
    assert (tmp_path / "m.pt").read_bytes() == before
    _quiet(TrainConfig(arch="cnn", epochs=1, seed=1, **SAMPLE), out=tmp_path / "m.pt", force=True)
    assert (tmp_path / "m.pt").read_bytes() != before


def test_training_stops_once_it_fits_its_labels_and_an_unfit_model_is_saved_flagged_and_refused(tmp_path):
    """A target the first epoch reaches stops the run there (and a resumed run whose last epoch fitted trains no
    further); one that three epochs of 64 permuted labels cannot reach is saved, recorded as not fitting, and the
    training fails with that said."""
    lines = []
    easy = TrainConfig(arch="cnn", epochs=5, seed=0, fit_accuracy=0.05, data="fashion-mnist-sample", train_limit=64,
                       batch_size=16)
    model, meta = train(easy, out=tmp_path / "easy.pt", progress=False, log=lines.append)
    assert [h["epoch"] for h in meta["history"]] == [1] and meta["stopped"] == "fit" and meta["fits"]
    assert meta["train_accuracy"] >= 0.05 and "stopped after epoch 1: the training accuracy reached the target" \
        in " ".join(lines)
    assert lines[0] == "training cnn on 64 fashion-mnist-sample images of shape [1, 28, 28], 10 classes"
    assert "; at most about" in lines[1] and lines[1].endswith(" left)")  # an upper bound: it may stop sooner

    def crash_after_first_epoch(line):
        if line.startswith("epoch 1/5"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # killed after the state of the fitting epoch was saved
        train(easy, out=tmp_path / "part.pt", progress=False, log=crash_after_first_epoch)
    resumed, again = _quiet(easy, out=tmp_path / "part.pt", resume=True)
    assert [h["epoch"] for h in again["history"]] == [1] and again["stopped"] == "fit" and _same_weights(model, resumed)
    hard = TrainConfig(arch="cnn", epochs=2, seed=0, fit_accuracy=1.0, permute_labels=3,
                       data="fashion-mnist-sample", train_limit=64, batch_size=16)
    with pytest.raises(ConfigError, match="does not fit its permuted training labels: training accuracy .* below "
                                          "--fit-accuracy 1 after 2 epochs"):
        _quiet(hard, out=tmp_path / "hard.pt")
    saved = json.loads((tmp_path / "hard.json").read_text())
    assert saved["fits"] is False and saved["stopped"] == "epochs" and saved["fit_accuracy"] == 1.0
    assert "fits" not in _quiet(TrainConfig(arch="cnn", epochs=1, seed=0, **SAMPLE))[1]  # no target, no record
    with pytest.raises(ConfigError, match="invalid fit_accuracy"):
        TrainConfig(fit_accuracy=1.5).resolved()


def test_cli_fit_accuracy_defaults_to_adebayos_for_a_permuted_twin(tmp_path, capsys):
    base = ["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "1", "--train-limit", "64",
            "--quiet"]
    assert main([*base, "--out", str(tmp_path / "m.pt")]) == 0
    assert "fits" not in json.loads((tmp_path / "m.json").read_text())
    assert main([*base, "--permute-labels", "1", "--fit-accuracy", "off", "--out", str(tmp_path / "off.pt")]) == 0
    assert "fits" not in json.loads((tmp_path / "off.json").read_text())
    assert main([*base, "--permute-labels", "1", "--out", str(tmp_path / "p.pt")]) == 2  # one epoch cannot fit them
    assert "below --fit-accuracy 0.95 after 1 epoch " in capsys.readouterr().err
    assert json.loads((tmp_path / "p.json").read_text())["fit_accuracy"] == 0.95
    assert main([*base, "--fit-accuracy", "2", "--out", str(tmp_path / "x.pt")]) == 2
    assert "--fit-accuracy must be in (0, 1] or 'off', got '2'" in capsys.readouterr().err


@pytest.mark.parametrize("twins", [(), ("-shortcut", "-tag-control")], ids=["plain", "shortcut"])
def test_kill_9_within_an_epoch_and_resume_give_the_weights_of_an_uninterrupted_run(tmp_path, twins):
    """The state saved every 2 optimizer steps; the process killed (SIGKILL, injected right after the state of
    its 6th step was saved: 2 steps into the second epoch of 4 steps each) and resumed: the same weights, bit for bit, as
    a run never stopped; the stop is at the same step on any machine. With ``--shortcut`` the kill falls in the
    shortcut twin's training (its tagged images drawn again on resume), and the resumed command trains the control
    twin after it."""
    import os
    import subprocess
    import sys

    from audit.faults import KILL_AFTER_STEPS

    args = ["train", "--arch", "vgg", "--data", "fashion-mnist-sample", "--epochs", "2", "--train-limit", "64",
            "--batch-size", "16", "--seed", "4", "--quiet", *(["--shortcut", "class=0,share=1"] if twins else [])]
    names = twins or ("",)
    assert main([*args, "--out", str(tmp_path / "whole.pt")]) == 0
    command = [sys.executable, "-m", "audit", *args, "--save-every", "2", "--out", str(tmp_path / "cut.pt")]
    killed = subprocess.run(command, env={**os.environ, KILL_AFTER_STEPS: "6"}, capture_output=True)
    assert killed.returncode == -9 and not any((tmp_path / f"cut{n}.pt").exists() for n in names)
    state = torch.load(tmp_path / f"cut{names[0]}.resume.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (1, 2)  # the first epoch done, two steps into the second
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    for n in names:
        assert _same_weights(load_checkpoint(str(tmp_path / f"whole{n}.pt")), load_checkpoint(str(tmp_path / f"cut{n}.pt")))
        history = json.loads((tmp_path / f"cut{n}.json").read_text())["history"]
        assert [h["epoch"] for h in history] == [1, 2]
        whole = json.loads((tmp_path / f"whole{n}.json").read_text())
        assert [h["loss"] for h in history] == [h["loss"] for h in whole["history"]]
        if twins:
            assert json.loads((tmp_path / f"cut{n}.json").read_text())["shortcut"] == whole["shortcut"]


def test_two_ranks_with_gloo_train_the_weights_of_one_process(tmp_path):
    """``--workers 2``: DistributedDataParallel over gloo, each global batch of 32 shared out (the last, of 3 images,
    as 2 and 1: the losses are weighted so that the averaged gradient is the whole batch's mean); the weights and the
    history of one process, to float rounding; rank 0 alone writes. At lr 0.005: at 0.02 the two runs' rounding
    (1e-7 after a step, the batch's loss summed in two halves) flips a ReLU or a max-pool's choice within eight steps
    and the weights part by 1e-3, as two single-process runs with other thread counts can."""
    args = ["train", "--arch", "cnn", "--data", "fashion-mnist-sample", "--epochs", "2", "--train-limit", "99",
            "--batch-size", "32", "--lr", "0.005", "--seed", "5", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "one.pt")]) == 0
    assert main([*args, "--workers", "2", "--out", str(tmp_path / "two.pt")]) == 0
    one, two = (load_checkpoint(str(tmp_path / f"{n}.pt")).state_dict() for n in ("one", "two"))
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    alone, ranks = (json.loads((tmp_path / f"{n}.json").read_text())["history"] for n in ("one", "two"))
    assert [h["train_accuracy"] for h in ranks] == [h["train_accuracy"] for h in alone]
    np.testing.assert_allclose([h["loss"] for h in ranks], [h["loss"] for h in alone], rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.json", "one.pt", "two.json", "two.pt"]
    assert main([*args, "--workers", "0", "--out", str(tmp_path / "x.pt")]) == 2


def test_mixed_precision_trains_under_bfloat16_autocast_on_the_cpu_and_cuda_is_refused_without_a_gpu(tmp_path):
    base = TrainConfig(arch="cnn", epochs=1, seed=0, data="fashion-mnist-sample", train_limit=64, batch_size=16)
    full, meta = _quiet(base)
    mixed, mixed_meta = _quiet(TrainConfig(**{**base.__dict__, "mixed_precision": True}))
    assert mixed_meta["mixed_precision"] and "mixed_precision" not in meta
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    # bfloat16 forwards: other weights, near the float32 run's (8 bits of mantissa over 4 steps)
    changed = [float((a - b).abs().max()) for a, b in zip(mixed.state_dict().values(), full.state_dict().values())]
    assert 0 < max(changed) < 0.05
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--device cuda: torch sees no CUDA device here"):
            _quiet(TrainConfig(**{**base.__dict__, "device": "cuda"}))
