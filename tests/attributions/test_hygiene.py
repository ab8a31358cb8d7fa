"""Every public call leaves the caller's process as it found it, whether it returns or raises.

The public API is enumerated from the packages' ``__all__``: a name added there without an entry below fails
:func:`test_every_public_name_is_called_here`.
"""
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import attributions
import audit
from attributions import Explainer
from attributions.graph import trace
from attributions.hygiene import untouched
from audit.data import embedded_sample
from audit.models import load_checkpoint
from audit.models.training import TrainConfig


def _state() -> dict:
    """What a caller can observe of the process."""
    return dict(
        rng=torch.get_rng_state(), numpy_rng=np.random.get_state()[1].copy(), environ=dict(os.environ),
        threads=sorted(t.name for t in threading.enumerate()), fds=sorted(os.listdir("/proc/self/fd")),
        filters=list(warnings.filters), grad=torch.is_grad_enabled(), dtype=torch.get_default_dtype(),
        num_threads=torch.get_num_threads(), cwd=os.getcwd(),
        deterministic=(torch.are_deterministic_algorithms_enabled(),
                       torch.is_deterministic_algorithms_warn_only_enabled()))


def _differences(before: dict, after: dict) -> list[str]:
    return [key for key in before if not (torch.equal(before[key], after[key]) if isinstance(before[key], torch.Tensor)
                                          else np.array_equal(before[key], after[key]) if key == "numpy_rng"
                                          else before[key] == after[key])]


@pytest.fixture(scope="module")
def subject():
    # importing a module may add warning filters (scipy's do): resolve every lazy name first, so that what is
    # compared is what a call does
    for package in (attributions, audit):
        for name in package.__all__:
            getattr(package, name)
    model = load_checkpoint("cnn-sgd")
    x, y = embedded_sample()
    return model, torch.from_numpy(x[:4]), torch.from_numpy(y[:4])


def _calls(subject, tmp: Path) -> dict[str, tuple[Callable[[], object], Callable[[], object] | None]]:
    """Public name -> (a call that succeeds, a call that raises the toolkit's error, or None where the name takes
    nothing a caller could get wrong)."""
    model, x, y = subject
    quick = dict(progress=False)
    config = dict(methods="gradient,smoothgrad", tests="random-logit", n_images=4)
    results = tmp / "run"

    def audit_run(**overrides):
        return audit.run_audit(audit.load_config(models=["cnn-sgd"], **{**config, **overrides}), results,
                               progress=False, log=lambda s: None)

    def trained(epochs=1):
        fields = dict(arch="cnn", epochs=epochs, data="fashion-mnist-sample", train_limit=64, batch_size=32)
        return audit.train(TrainConfig(**fields), progress=False, log=lambda s: None)

    def table():
        return audit.random_logit_test(model, x, y, "gradient", **quick)

    return {
        "Explainer": (lambda: Explainer(model, "smoothgrad").attribute(x, target=y),
                      lambda: Explainer(model, "smoothgrad").attribute(x, target=torch.full_like(y, 99))),
        "build_method": (lambda: attributions.build_method("lrp-epsilon"),
                         lambda: attributions.build_method("no-such-method")),
        "available_methods": (attributions.available_methods, None),
        "chain_convergence": (lambda: audit.chain_convergence(model, x, y, "lrp-zplus", n_vectors=2, **quick),
                              lambda: audit.chain_convergence(model, x, y, "no-such-method", **quick)),
        "coverage": (lambda: audit.coverage(model, x), lambda: audit.coverage(model, x, order="sideways")),
        "data_randomization": (lambda: audit.data_randomization(model, load_checkpoint("cnn-permuted"), x, y,
                                                                "gradient", **quick),
                               lambda: audit.data_randomization(model, model, x, y, "no-such-method", **quick)),
        "shortcut_test": (lambda: audit.shortcut_test(load_checkpoint("cnn-shortcut"), load_checkpoint("cnn-tag-control"),
                                                      audit.Tag(), x, y, "smoothgrad"),
                          lambda: audit.shortcut_test(model, model, audit.Tag(), x, y, "no-such-method")),
        "Tag": (lambda: audit.Tag.parse("class=1").paste(x), lambda: audit.Tag.parse("size=0")),
        "efficient_mprt": (lambda: audit.efficient_mprt(model, x, y, "smoothgrad", **quick),
                           lambda: audit.efficient_mprt(model, x, y, "no-such-method", **quick)),
        "input_invariance": (lambda: audit.input_invariance(model, x, y, "gradient", **quick),
                             lambda: audit.input_invariance(model, x, y, "no-such-method", **quick)),
        "parameter_randomization": (lambda: audit.parameter_randomization(model, x, y, "smoothgrad", **quick),
                                    lambda: audit.parameter_randomization(model, x, y, "no-such-method", **quick)),
        "randomization_with_maps": (lambda: audit.randomization_with_maps(model, x, y, "gradient", **quick),
                                    lambda: audit.randomization_with_maps(model, x, y, "gradient", keep_maps=-1,
                                                                          **quick)),
        "random_logit_test": (table, lambda: audit.random_logit_test(model, x, y, "no-such-method", **quick)),
        "smooth_mprt": (lambda: audit.smooth_mprt(model, x, y, "gradient", n_samples=3, **quick),
                        lambda: audit.smooth_mprt(model, x, y, "gradient", n_samples=0, **quick)),
        "randomization_plan": (lambda: audit.randomization_plan(model, trace(model, x[:1])),
                               lambda: audit.randomization_plan(model, trace(model, x[:1]), "atoms")),
        "get_check": (lambda: audit.get_check("random-logit"), lambda: audit.get_check("no-such-check")),
        "run_audit": (audit_run, lambda: audit_run(methods="no-such-method")),
        "load_config": (lambda: audit.load_config(n_images=4), lambda: audit.load_config(n_imagez=4)),
        "load_results": (lambda: audit.load_results(results), lambda: audit.load_results(tmp / "nowhere")),
        "train": (trained, lambda: trained(epochs=0)),
        "load_checkpoint": (lambda: load_checkpoint("cnn-sgd"), lambda: load_checkpoint(tmp / "missing.pt")),
        "save_checkpoint": (lambda: audit.save_checkpoint(model, model.metadata, tmp / "copy.pt"),
                            lambda: audit.save_checkpoint(model, {"seed": object()}, tmp / "other.pt")),
        "available_checkpoints": (audit.available_checkpoints, None),
        "shipped_twin": (lambda: audit.shipped_twin("cnn-sgd"), lambda: audit.shipped_twin("cnn-sgd", role="cousin")),
        "load_dataset": (lambda: audit.load_dataset("fashion-mnist-sample", "test"),
                         lambda: audit.load_dataset("no-such-data", "test")),
        "balanced_sample": (lambda: audit.balanced_sample("embedded", 10),
                            lambda: audit.balanced_sample("embedded", 0)),
        "embedded_sample": (audit.embedded_sample, None),
        "heatmaps": (lambda: audit.heatmaps({"gradient": x}), lambda: audit.heatmaps({"no-such-method": x})),
        "ssim": (lambda: audit.ssim(x[:, 0], x[:, 0]), lambda: audit.ssim(x[:, 0], x[:2, 0])),
        "spearman": (lambda: audit.spearman(x, x), lambda: audit.spearman(x, x[:2])),
        "bootstrap_ci": (lambda: audit.bootstrap_ci(np.arange(10.0)), lambda: audit.bootstrap_ci(np.arange(10.0),
                                                                                                  level=2.0)),
        "summarize": (lambda: audit.summarize(table()), lambda: audit.summarize(table(), level=0.0)),
    }


# Names that are not calls of the toolkit's work: errors, configuration and result types, tables, a module.
VALUES = {"AttributionError", "ToolkitError", "Method", "rules", "AuditError", "ConfigError", "DataError",
          "ModelError", "AuditConfig", "AuditResult", "TrainConfig", "CHECKS"}
# A constructor draws the new model's weights from torch's generator, as torch's own modules do: that draw is
# what a caller seeding torch before it expects. Everything else it leaves alone.
DRAWS = {"build": "rng"}


def test_every_public_name_is_called_here(subject, tmp_path):
    covered = set(_calls(subject, tmp_path)) | VALUES | set(DRAWS)
    public = set(attributions.__all__) | set(audit.__all__)
    assert public - covered == set(), "add these public names to the calls of this test"
    assert covered - public == set()


def _after(call: Callable[[], object], fails: bool) -> list[str]:
    torch.manual_seed(1234)
    before = _state()
    if fails:
        with pytest.raises((attributions.ToolkitError, ValueError, KeyError)):
            call()
    else:
        call()
    return _differences(before, _state())


@pytest.mark.parametrize("name", sorted((set(attributions.__all__) | set(audit.__all__)) - VALUES))
def test_a_public_call_leaves_the_process_as_it_was(subject, tmp_path, name):
    if name in DRAWS:
        def build():
            return audit.build("cnn")
        assert _after(build, fails=False) == [DRAWS[name]]
        assert _after(lambda: audit.build("no-such-arch"), fails=True) == []
        return
    calls = _calls(subject, tmp_path)
    if name == "load_results":
        calls["run_audit"][0]()
    succeeds, fails = calls[name]
    assert _after(succeeds, fails=False) == []
    if fails is not None:
        assert _after(fails, fails=True) == []


def test_untouched_restores_what_its_body_changed_and_nests_without_snapshotting_again():
    torch.manual_seed(0)
    state, filters = torch.get_rng_state(), list(warnings.filters)
    with untouched():
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        warnings.simplefilter("ignore")
        os.environ["ATTRIBUTIONS_TEST_VARIABLE"] = "set by the body"
        with untouched():
            torch.rand(1)
        inner = torch.get_rng_state()
    assert not torch.equal(inner, state), "an inner call advances the generator for the calls after it"
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert "ATTRIBUTIONS_TEST_VARIABLE" not in os.environ and warnings.filters == filters
