"""The memory budget: chunked passes give the maps of one batched pass, and chunk as promised."""
import pytest
import torch

from attributions import AttributionError, Explainer, memory
from attributions.graph import trace
from attributions.shared_pass import SharedPass
from audit.checks.convergence import chain_convergence
from audit.models import build

CHAIN_METHODS = ["gradient", "lrp-epsilon", "lrp-zplus", "deeplift", "guided-backprop"]


def _model(arch: str):
    torch.manual_seed(0)
    return build(arch, (1, 16, 16), 10).eval()


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> bool:
    """Equal to float32 rounding (the batched kernels block differently by batch size): elementwise
    within ``rtol`` of the largest value, and every map's direction kept."""
    cos = torch.nn.functional.cosine_similarity(a.flatten(-3).double(), b.flatten(-3).double(), dim=-1)
    return bool((a - b).abs().max() <= rtol * a.abs().max().clamp_min(1e-30)) and bool(cos.min() > 1 - 1e-6)


def test_limit_is_scoped_and_refuses_nonsense():
    default = memory.budget()
    free = memory.available_bytes(torch.device("cpu"))
    assert default == memory.default_budget() and 0 < default <= free  # half of what was free when first read
    assert not memory.is_set()
    with memory.limit(1000):
        assert memory.budget() == 1000 and memory.is_set()
        with memory.limit(None):
            assert memory.budget() is None
        assert memory.budget() == 1000
        with memory.limit("1.5GiB"):
            assert memory.budget() == 3 * 2**29
    assert memory.budget() == default
    for bad in (0, -5):
        with pytest.raises(ValueError, match="positive"), memory.limit(bad):
            pass
    for bad in ("12 parsecs", "1MB"):
        with pytest.raises(AttributionError, match="max_memory"):
            Explainer(_model("cnn"), "gradient", max_memory=bad)


def test_tensor_bytes_counts_each_storage_once():
    a = torch.zeros(100)  # 400 bytes
    env = {"a": a, "view": a[:10], "pair": (torch.zeros(10, dtype=torch.float64), [a]), "name": "x"}
    assert memory.tensor_bytes(env) == 400 + 80


def test_fitting_and_spans():
    assert memory.fitting(10, 100) == 10  # no budget: everything at once
    with memory.limit(1000):
        assert memory.fitting(10, 100) == 10
        assert memory.fitting(10, 300) == 3
        assert memory.fitting(10, 300, fixed=500) == 1
        assert memory.fitting(10, 10_000) == 1  # one item that does not fit still runs, alone
    assert memory.spans(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert memory.spans(2, 5) == [(0, 2)]


@pytest.mark.parametrize("arch", ["cnn", "resnet"])
def test_chunked_maps_equal_one_batched_pass(arch, monkeypatch):
    model = _model(arch)
    x = torch.rand(5, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 3, 1, 7, 2])
    for method in CHAIN_METHODS:
        ex = Explainer(model, method)
        whole = ex.maps_for_targets(x, [y, 4])
        calls = []
        run = ex._run
        monkeypatch.setattr(ex, "_run", lambda inputs, *a, **k: calls.append(len(inputs)) or run(inputs, *a, **k))
        per_image = ex.bytes_per_image(x)
        calls.clear()
        with memory.limit(per_image * 3 * 2):  # two images with their two targets' signals
            chunked = ex.maps_for_targets(x, [y, 4])
        assert calls == [2, 2, 1], (method, calls)  # the images went in chunks, each with its own forward pass
        assert chunked.shape == whole.shape
        # the epsilon rule divides by pre-activations near zero, which magnifies the rounding
        assert _close(whole, chunked, 1e-3 if method == "lrp-epsilon" else 1e-5), method


def test_vectors_chunk_over_one_shared_forward_pass(monkeypatch):
    model = _model("cnn")
    x = torch.rand(3, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    ex = Explainer(model, "lrp-epsilon")
    logits = ex.forward(x)
    vectors = torch.randn(8, *logits.shape, generator=torch.Generator().manual_seed(3))
    whole = ex.propagate(x, ex.layers[-1], vectors)
    backwards = []
    step = ex._backward
    monkeypatch.setattr(ex, "_backward", lambda env, ref, start, signal, *a, **k:
                        backwards.append(len(signal)) or step(env, ref, start, signal, *a, **k))
    env = ex._forward_envs(x)[0]
    held = memory.tensor_bytes(env)
    with memory.limit(held * 4):  # the forward values and three vectors' signals
        chunked = ex._signals(x, ex.layers[-1], lambda e: vectors, shared=SharedPass(env))
    assert backwards == [3, 3, 2]
    for name, value in whole.items():
        assert chunked[name].shape == value.shape
        assert _close(value, chunked[name]), name


def test_propagate_chunks_images_with_their_vectors():
    model = _model("resnet")
    x = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(4))
    ex = Explainer(model, "lrp-zplus", graph=trace(model, x))
    vectors = torch.randn(5, 4, 10, generator=torch.Generator().manual_seed(5))
    whole = ex.propagate(x, ex.layers[-1], vectors)
    with memory.limit(1):  # one image at a time, one vector at a time
        chunked = ex.propagate(x, ex.layers[-1], vectors)
    assert whole.keys() == chunked.keys()
    assert all(_close(whole[k], chunked[k]) for k in whole)


def test_csc_under_a_budget_matches_the_batched_table():
    model = _model("cnn")
    x = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(6))
    whole = chain_convergence(model, x, methods=["lrp-zplus", "gradient"], progress=False)
    with memory.limit(1):
        chunked = chain_convergence(model, x, methods=["lrp-zplus", "gradient"], progress=False)
    assert list(whole.columns) == list(chunked.columns)
    assert whole[["method", "inject_at", "layer", "collapsed"]].equals(chunked[["method", "inject_at", "layer",
                                                                               "collapsed"]])
    numbers = whole.select_dtypes("number").columns
    assert (whole[numbers] - chunked[numbers]).abs().max().max() < 1e-5


@pytest.mark.parametrize("method,kwarg", [("integrated-gradients", "internal_batch_size"),
                                          ("smoothgrad", "nt_samples_batch_size")])
def test_sampling_methods_batch_their_samples_under_a_budget(method, kwarg, monkeypatch):
    from captum.attr import IntegratedGradients, NoiseTunnel
    model = _model("cnn")
    x = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(7))
    ex = Explainer(model, method)
    seen = []
    peer = IntegratedGradients if method == "integrated-gradients" else NoiseTunnel
    original = peer.attribute
    monkeypatch.setattr(peer, "attribute", lambda self, *a, **k: seen.append(k.get(kwarg)) or original(self, *a, **k))
    torch.manual_seed(0)
    with memory.limit(None):
        whole = ex.attribute(x, target=1)
    assert seen[-1] is None
    per_image = ex.bytes_per_image(x)
    torch.manual_seed(0)
    with memory.limit(per_image * 2 * 2 * 3):
        chunked = ex.attribute(x, target=1)
    # 12 images' worth: 6 path points of the 2 images; 6 noisy copies of one image (seeded noise: an image per call)
    assert seen[-1] == 6
    if method == "integrated-gradients":  # the same path points, summed in chunks
        assert _close(whole, chunked)


def test_every_method_holds_a_small_budget_in_a_fresh_process():
    """Each method's maps of 16 images of 64 x 64 (a VGG; the attention methods on a ViT) under a 24 MiB budget,
    in a fresh process: the resident memory the call adds stays within the budget (or one image's pass, which
    cannot be split, where that is larger), with a quarter and 8 MiB to spare for what the estimate of a pass
    leaves out; where the unbudgeted call adds more than twice that, the budget at least halves it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from attributions import available_methods

    script = Path(__file__).with_name("memory_peaks.py")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(script.parents[2])}
    done = subprocess.run([sys.executable, str(script), "24", "16"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["method"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert set(rows) == set(available_methods())
    over, unbound = [], []
    for name, r in rows.items():
        allowed = 1.25 * max(24.0, r["one_image"]) + 8
        if r["budget"] > allowed:
            over.append((name, round(r["budget"], 1), round(allowed, 1)))
        if r["none"] > 2 * allowed and r["budget"] > r["none"] / 2:
            unbound.append((name, round(r["budget"], 1), round(r["none"], 1)))
    assert over == [] and unbound == []
    # it binds: integrated gradients and the five attention maps (SmoothGrad's seeded noise takes an image per call,
    # its noisy copies of one image under the budget unbounded)
    assert sum(r["none"] > 2 * (1.25 * max(24.0, r["one_image"]) + 8) for r in rows.values()) >= 6
