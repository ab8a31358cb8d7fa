"""A library call to the audit leaves the caller's process as it found it."""
import os
import textwrap
import threading

import pytest
import torch

from audit.errors import ModelError
from audit.models import load_checkpoint, save_checkpoint
from audit.run.config import load_config
from audit.run.hygiene import untouched
from audit.run.runner import run_audit


def test_an_audit_leaves_the_rng_the_environment_and_the_threads_as_they_were(tmp_path):
    torch.manual_seed(1234)
    state, environ, threads = torch.get_rng_state(), dict(os.environ), {t.name for t in threading.enumerate()}
    run_audit(load_config(models=["cnn-sgd"], methods="gradient,random", tests="random-logit", n_images=4),
              tmp_path / "run", progress=False, log=lambda s: None)
    assert torch.equal(torch.get_rng_state(), state)
    assert dict(os.environ) == environ
    assert {t.name for t in threading.enumerate()} == threads


def test_untouched_restores_what_its_body_changed_even_on_an_error():
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError), untouched():
        torch.manual_seed(7)
        os.environ["AUDIT_TEST_VARIABLE"] = "set by the body"
        raise RuntimeError("the body failed")
    assert torch.equal(torch.get_rng_state(), state) and "AUDIT_TEST_VARIABLE" not in os.environ


def test_a_model_that_cannot_be_built_leaves_nothing_behind(tmp_path):
    """A refused model leaves no folder and no "running" manifest: the corrected rerun starts as if new."""
    model = load_checkpoint("cnn-sgd")
    with torch.no_grad():
        model.classifier[2].weight[0, 0] = float("nan")
    save_checkpoint(model, model.metadata, tmp_path / "broken.pt")
    out = tmp_path / "run"
    config = dict(methods="gradient", tests="random-logit", n_images=4)
    with pytest.raises(ModelError, match="NaN or infinite"):
        run_audit(load_config(models=[str(tmp_path / "broken.pt")], **config), out, progress=False, log=lambda s: None)
    assert not out.exists()
    result = run_audit(load_config(models=["cnn-sgd"], **config), out, progress=False, log=lambda s: None)
    assert result.manifest["status"] == "complete"


def test_bad_options_are_refused_before_any_model_is_loaded(tmp_path, monkeypatch):
    """A wrong option's error comes before the (possibly slow) model build, and leaves no folder behind."""
    from audit.cli import main
    from audit.errors import ConfigError

    def no_build(*args, **kwargs):
        raise AssertionError("a model was built before the options were checked")

    monkeypatch.setattr("audit.models.checkpoint.resolve_model", no_build)
    monkeypatch.setattr("audit.run.plan.resolve_model", no_build)
    for bad in (dict(csc_threshold=2.0), dict(methods="gradient,no-such-method"), dict(n_images=1),
                dict(tests="cascade"), dict(twins="cnn-sgd"), dict(allow_partial_weights="yes")):
        with pytest.raises(ConfigError):
            run_audit(load_config(models=["timm:resnet18"], **{"tests": "random-logit", **bad}), tmp_path / "run",
                      progress=False, log=lambda s: None)
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):  # an abbreviated option is not taken for --methods
        main(["run", "--models", "timm:resnet18", "--method", "gradient", "--out", str(tmp_path / "run")])


def test_a_model_whose_hooks_change_its_output_is_refused_before_the_folder_is_made(tmp_path, monkeypatch):
    """The engine refuses such a model at its first unit; the run refuses it first, leaving no "running" manifest."""
    (tmp_path / "hooked_factory.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def _clip(t):
            t.clamp_(min=-1, max=1)

        def build():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
            model[0].register_forward_hook(lambda module, args, out: _clip(out))
            return model.eval()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    with pytest.raises(ModelError, match="hooked_factory:build: the model has hooks that may change what it computes"):
        run_audit(load_config(models=["hooked_factory:build"], methods="gradient", tests="random-logit", n_images=4),
                  out, progress=False, log=lambda s: None)
    assert not out.exists()
