"""Training on an image folder, streamed: each batch read when it is needed (never the folder at once), the same
weights as the same images held in memory and whatever the number of loader workers, and a run killed mid-epoch
resumes to the weights of one never stopped."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from audit.data.datasets import load_dataset
from audit.faults import KILL_AFTER_STEPS
from audit.models import load_checkpoint, train
from audit.models import training as training_module
from audit.models.splits import ArraySplit, StreamSplit
from audit.models.training import OPTIMIZERS, OptimizerSpec, TrainConfig, register_optimizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The embedded Fashion-MNIST sample as PNG files: train/ and test/, one sub-folder per class."""
    root = tmp_path_factory.mktemp("fashion")
    for split in ("train", "test"):
        x, y = load_dataset("fashion-mnist-sample", split)
        for i, (image, label) in enumerate(zip(x, y)):
            (root / split / f"{label:02d}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.round(image[0] * 255).astype(np.uint8), "L").save(root / split / f"{label:02d}" / f"{i}.png")
    return root


def _config(folder, **kw):
    return TrainConfig(**{"arch": "cnn", "data": "imagefolder", "data_root": str(folder), "epochs": 1,
                          "batch_size": 16, "train_limit": 64, "seed": 3, **kw})


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_streamed_training_reads_each_batch_when_it_is_needed(folder, monkeypatch):
    events = []
    reading = training_module.FolderImages._read
    monkeypatch.setattr(training_module.FolderImages, "_read", lambda self, i: events.append("read") or reading(self, i))

    class Counting(torch.optim.SGD):
        def step(self, closure=None):
            events.append("step")
            return super().step(closure)

    def counting(model, config):
        return Counting(model.parameters(), lr=config.lr, momentum=config.momentum)

    register_optimizer("counting-sgd", OptimizerSpec(counting, lr=0.02, weight_decay=0.0, description="test"))
    try:
        train(_config(folder, optimizer="counting-sgd", train_limit=80), progress=False, log=lambda s: None)
    finally:
        OPTIMIZERS.pop("counting-sgd")
    steps = [k for k, e in enumerate(events) if e == "step"]
    assert len(steps) == 5  # 80 images in batches of 16
    # before the k-th step: the two folders' first images (their shapes), the first image once more (the model's
    # outputs checked against the classes) and k batches, no more
    for k, position in enumerate(steps, start=1):
        assert events[:position].count("read") == 3 + 16 * k
    assert events.count("read") == 3 + 80 + 80 + 200  # then the training (eval) and test accuracies, streamed too


def test_the_weights_are_those_of_the_images_held_in_memory_whatever_the_loader_workers(folder, monkeypatch):
    streamed, _ = train(_config(folder), progress=False, log=lambda s: None)
    workers, _ = train(_config(folder, loader_workers=2), progress=False, log=lambda s: None)
    assert _same(_weights(streamed), _weights(workers))
    folder_data = training_module._folder_data

    def in_memory(cfg):
        data = folder_data(cfg)
        assert isinstance(data.train, StreamSplit)
        held = [ArraySplit(torch.stack([s.folder[int(i)][0] for i in s.indices]).numpy(), s.y)
                for s in (data.train, data.test)]
        return training_module._Data(held[0], held[1], data.num_classes)

    monkeypatch.setattr(training_module, "_folder_data", in_memory)
    held, meta = train(_config(folder), progress=False, log=lambda s: None)
    assert _same(_weights(streamed), _weights(held))


def test_metadata_names_the_folder_and_its_fingerprint_follows_the_files(folder, tmp_path):
    _, meta = train(_config(folder), out=tmp_path / "m.pt", progress=False, log=lambda s: None)
    assert meta["data"]["root"] == str(folder) and meta["data"]["preprocess"] == {}
    assert meta["data"]["train_size"] == 64 and meta["data"]["test_size"] == 200 and meta["in_shape"] == [1, 28, 28]
    assert load_checkpoint(str(tmp_path / "m.pt")).metadata["data"]["sha256"] == meta["data"]["sha256"]
    _, permuted = train(_config(folder, permute_labels=1), progress=False, log=lambda s: None)
    assert permuted["data"]["sha256"] != meta["data"]["sha256"]  # other labels


def test_kill_9_mid_epoch_on_a_streamed_folder_resumes_to_the_uninterrupted_weights(folder, tmp_path):
    args = [sys.executable, "-m", "audit", "train", "--arch", "cnn", "--data", "imagefolder", "--data-root",
            str(folder), "--epochs", "2", "--train-limit", "64", "--batch-size", "16", "--seed", "4", "--quiet"]
    whole = subprocess.run([*args, "--out", str(tmp_path / "whole.pt")], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    cut = [*args, "--save-every", "1", "--out", str(tmp_path / "cut.pt")]
    killed = subprocess.run(cut, env={**os.environ, KILL_AFTER_STEPS: "5"}, capture_output=True)
    assert killed.returncode == -9 and not (tmp_path / "cut.pt").exists()
    resumed = subprocess.run([*cut, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert _same(load_checkpoint(str(tmp_path / "whole.pt")).state_dict(), load_checkpoint(str(tmp_path / "cut.pt")).state_dict())
    assert json.loads((tmp_path / "cut.json").read_text())["history"][0]["loss"] == \
        json.loads((tmp_path / "whole.json").read_text())["history"][0]["loss"]
