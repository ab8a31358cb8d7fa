"""The method sweep's judgement of one (model, method) cell, its rows and its summary, on a small CNN and a small
ViT written here; the sweep over the enumerated library models runs in the model-library suite
(``test_the_sweep_holds_on_a_sample_of_the_library_models``)."""
from __future__ import annotations

import torch
from torch import nn

from attributions.engines import RuleChain
from attributions.graph import trace
from benchmarks import method_sweep
from benchmarks.method_sweep import cell, rows_of, summary
from tests.model_libraries import TOLERANCE


def _cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 3)).double().eval()
    x = torch.randn(2, 2, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    xg = x.clone().requires_grad_()
    logits = model(xg)
    target = logits.detach().argmax(1)
    plain = torch.autograd.grad(logits[torch.arange(2), target].sum(), xg)[0]
    with torch.no_grad():
        f0 = model(torch.zeros_like(x))[torch.arange(2), target]
    fx = logits.detach()[torch.arange(2), target]
    reference = {"plain": plain, "difference": fx - f0, "scale": fx.abs(), "tolerance": TOLERANCE}
    return model, x, target, reference


def test_a_cell_is_exact_where_the_map_keeps_its_promise_and_refused_where_the_method_does_not_apply():
    model, x, target, reference = _cnn()
    graph = trace(model, x)
    for method in ("gradient", "deeplift", "lrp-epsilon", "grad-cam"):
        result = cell(model, graph, x, target, method, {}, reference=reference)
        assert result["outcome"] == "exact", (method, result)
        if method in ("gradient", "deeplift"):  # the promise computed another way and kept
            assert result["error"] is not None and result["error"] <= TOLERANCE
    refused = cell(model, graph, x, target, "attention-rollout", {}, reference=reference)
    assert refused["outcome"] == "refused" and "attention" in refused["reason"]


def test_a_cell_fails_on_a_raw_exception_a_nonfinite_map_and_a_broken_promise(monkeypatch):
    model, x, target, reference = _cnn()
    graph = trace(model, x)
    broken = dict(reference, difference=reference["difference"] + 1.0)  # f(x) - f(0) as if the map missed it
    result = cell(model, graph, x, target, "deeplift", {}, reference=broken)
    assert result["outcome"] == "failed" and "difference missed by" in result["reason"]

    def raw(self, ex, x, targets, shared=None, **kwargs):
        raise RuntimeError("The size of tensor a (2) must match the size of tensor b (16)")

    with monkeypatch.context() as patch:
        patch.setattr(RuleChain, "maps", raw)
        result = cell(model, graph, x, target, "gradient", {}, reference=reference)
    assert result == {"outcome": "failed", "reason": "RuntimeError: The size of tensor a (2) must match the size of "
                      "tensor b (16)", "error": None}

    original = RuleChain.maps

    def nan(self, ex, x, targets, envs=None, **kwargs):
        return original(self, ex, x, targets, envs, **kwargs) * float("nan")

    with monkeypatch.context() as patch:
        patch.setattr(RuleChain, "maps", nan)
        result = cell(model, graph, x, target, "lrp-epsilon", {}, reference=reference)
    assert result["outcome"] == "failed" and result["reason"] == "not finite"


def test_a_model_refused_at_capture_refuses_every_method_and_a_crash_fails_those_it_did_not_finish():
    methods = ("gradient", "deeplift")
    refused = rows_of({"library": "timm", "name": "m", "note": "module seq", "class": "refused", "stage": "capture",
                       "reason": "no rule for aten.lstm.input"}, methods)
    assert [r["outcome"] for r in refused] == ["refused"] * 2 and all("aten.lstm" in r["reason"] for r in refused)
    assert {r["family"] for r in refused} == {"seq"}
    done = {"outcome": "exact", "reason": "", "error": 0.0, "seconds": 1.0}
    crashed = rows_of({"library": "hf", "name": "n", "class": "skipped", "stage": "deeplift",
                       "reason": "over the 900 s limit", "cells": {"gradient": done}}, methods)
    assert [r["outcome"] for r in crashed] == ["exact", "failed"]
    assert crashed[1]["reason"] == "skipped (at deeplift): over the 900 s limit"


def test_the_summary_counts_every_cell_and_groups_the_reasons_over_models():
    rows = [{"library": "timm", "model": f"m{i}", "method": method, "outcome": outcome, "reason": reason}
            for i in range(3)
            for method, outcome, reason in (("gradient", "exact", ""),
                                            ("attention-rollout", "refused", f"the model m{i} has no attention layer"),
                                            ("grad-cam", "failed" if i == 0 else "exact", "not finite" if i == 0 else ""))]
    text = summary(rows)
    assert "| timm | 3 | 3 | 5 | 3 | 1 |" in text and "| all | 3 | 3 | 5 | 3 | 1 |" in text
    assert "| the model … has no attention layer | 3 | 3 | attention-rollout | timm m0 |" in text  # one group, names masked
    assert "| not finite | 1 | 1 | grad-cam | timm m0 |" in text


def test_the_kept_rows_are_read_back_only_for_models_swept_with_every_method(tmp_path):
    path = tmp_path / "sweep.rows.csv"
    base = {"library": "timm", "family": "f", "outcome": "exact", "reason": "", "error": "", "seconds": 1}
    method_sweep._append(path, [base | {"model": "a", "method": "gradient"}, base | {"model": "a", "method": "deeplift"}])
    method_sweep._append(path, [base | {"model": "b", "method": "gradient"}])
    kept = method_sweep._read(path, ("gradient", "deeplift"))
    assert {r["model"] for r in kept} == {"a"} and len(kept) == 2
    assert {r["model"] for r in method_sweep._read(path, ("gradient",))} == {"a", "b"}


# the sample make test sweeps: the models whose maps the sweep was built to hold (MobileViT and MViTv2 fold patches
# into the batch axis), with every method; EfficientViT's linear attention has its own DeepLIFT test in the library
# suite (tests/attributions/test_rules.py), and make sweep runs every enumerated model
SAMPLE = ("mobilevit_xxs", "mvitv2_tiny")


def test_the_sweep_holds_on_a_sample_of_the_library_models():
    """Every method on each model of :data:`SAMPLE` gives an exact map or the toolkit's refusal; the class-activation
    methods whose automatic layer would fold the batch axis say so (``make sweep``: every enumerated model)."""
    import os

    import pytest

    from attributions.methods import BUILDERS
    from tests.model_libraries import timm_entries

    if os.environ.get("MODEL_LIBRARIES") != "required":
        pytest.importorskip("timm", reason="make test runs this in .venv-libraries")
    rows = []
    # in this process, one model after another: a forked child cannot run autograd once this process's earlier tests
    # have started autograd's threads (make sweep forks from a fresh process)
    for entry in timm_entries(list(SAMPLE)):
        result = {"library": entry.library, "name": entry.name, "note": entry.note, "class": "swept"}
        method_sweep._work(entry, result, 0, tuple(BUILDERS))
        rows += rows_of(result, tuple(BUILDERS))
    assert {(r["model"], r["method"]) for r in rows} == {(m, method) for m in SAMPLE for method in BUILDERS}
    failed = [f"{r['model']} {r['method']}: {r['reason']}" for r in rows if r["outcome"] == "failed"]
    assert not failed, "\n".join(failed)
    exact = {(r["model"], r["method"]) for r in rows if r["outcome"] == "exact"}
    for model in SAMPLE:  # the exactness checks ran: the chain methods hold on every one of them
        assert {(model, m) for m in ("gradient", "deeplift", "lrp-epsilon", "integrated-gradients")} <= exact
    for r in rows:
        if r["outcome"] == "refused":
            assert r["reason"] and "Error" not in r["reason"].split(":")[0], r  # the toolkit's words, not a raw type
