"""Every public entry point that takes a model or a checkpoint refuses the same hostile inputs with the toolkit's
error, or says what it did not refuse (a ToolkitWarning, recorded where a run records it).

The public API is enumerated from the packages' ``__all__``: a name added there must be classified below.
"""
import json
import warnings

import pytest
import torch

import attributions
import audit
from attributions import Explainer, ToolkitError
from attributions.errors import ToolkitWarning
from attributions.graph import trace
from attributions.validation import named, nonfinite_tensors
from audit.data import embedded_sample
from audit.models import load_checkpoint
from audit.models.training import TrainConfig

QUICK = dict(progress=False)


def _model_takers(x, y):
    """Public name -> a call of it on a given model."""
    return {
        "Explainer": lambda m: Explainer(m, "gradient").attribute(x, target=y),
        "chain_convergence": lambda m: audit.chain_convergence(m, x, y, "lrp-zplus", n_vectors=2, **QUICK),
        "coverage": lambda m: audit.coverage(m, x),
        "data_randomization": lambda m: audit.data_randomization(m, load_checkpoint("cnn-permuted"), x, y, "gradient",
                                                                 **QUICK),
        "shortcut_test": lambda m: audit.shortcut_test(m, load_checkpoint("cnn-tag-control"), audit.Tag(), x, y,
                                                       "gradient"),
        "efficient_mprt": lambda m: audit.efficient_mprt(m, x, y, "gradient", **QUICK),
        "input_invariance": lambda m: audit.input_invariance(m, x, y, "gradient", **QUICK),
        "parameter_randomization": lambda m: audit.parameter_randomization(m, x, y, "gradient", **QUICK),
        "randomization_with_maps": lambda m: audit.randomization_with_maps(m, x, y, "gradient", **QUICK),
        "random_logit_test": lambda m: audit.random_logit_test(m, x, y, "gradient", **QUICK),
        "smooth_mprt": lambda m: audit.smooth_mprt(m, x, y, "gradient", n_samples=2, **QUICK),
        "randomization_plan": lambda m: audit.randomization_plan(m, trace(m, x[:1])),
    }


def _checkpoint_takers(tmp):
    """Public name -> a call of it on a checkpoint's path."""
    def run(path):
        return audit.run_audit(audit.load_config(models=[str(path)], methods="gradient", tests="random-logit",
                                                 n_images=4), tmp / f"run-{path.stem}", progress=False,
                               log=lambda s: None)

    def twin_of(path):
        return audit.train(TrainConfig(arch="cnn", epochs=1, data="fashion-mnist-sample", train_limit=64,
                                       permute_labels=0, twin_of=str(path)), progress=False, log=lambda s: None)

    return {"load_checkpoint": audit.load_checkpoint, "run_audit": run, "train": twin_of}


# Names that take neither a model nor a checkpoint's weights, with what they take instead.
OTHERS = {"AttributionError": "an error", "ToolkitError": "an error", "AuditError": "an error",
          "ConfigError": "an error", "DataError": "an error", "ModelError": "an error", "Method": "a method's data",
          "rules": "a module of rule classes", "build_method": "a method's name", "available_methods": "nothing",
          "AuditConfig": "options", "AuditResult": "a run's tables", "TrainConfig": "options", "CHECKS": "a table",
          "get_check": "a check's name", "load_config": "options", "load_results": "a run's folder",
          "available_checkpoints": "nothing", "shipped_twin": "a shipped model's name", "build": "an architecture's "
          "name (the model it returns is fresh)", "save_checkpoint": "a model to write as it is (a broken one is "
          "refused when it is read back)", "load_dataset": "data", "balanced_sample": "data",
          "embedded_sample": "nothing", "heatmaps": "maps", "ssim": "maps", "spearman": "maps",
          "bootstrap_ci": "scores", "summarize": "a table", "Tag": "a tag's specification"}


@pytest.fixture(scope="module")
def images():
    x, y = embedded_sample()
    return torch.from_numpy(x[:4]), torch.from_numpy(y[:4])


def _broken(tmp, name, change):
    """The shipped cnn-sgd checkpoint with ``change`` made to its state, written as ``name``.pt."""
    model = load_checkpoint("cnn-sgd")
    state = model.state_dict()
    change(state)
    torch.save(state, tmp / f"{name}.pt")
    (tmp / f"{name}.json").write_text(json.dumps(model.metadata))
    return tmp / f"{name}.pt"


def test_every_public_name_is_classified(images, tmp_path):
    classified = set(_model_takers(*images)) | set(_checkpoint_takers(tmp_path)) | set(OTHERS)
    public = set(attributions.__all__) | set(audit.__all__)
    assert public - classified == set()
    assert classified - public == set()


@pytest.mark.parametrize("name", sorted(_model_takers(None, None)))
def test_a_model_with_a_non_finite_weight_is_refused(images, name):
    model = load_checkpoint("cnn-sgd")
    with torch.no_grad():
        model.classifier[2].weight[3, 1] = float("nan")
        model.features[0].bias[0] = float("inf")
    with pytest.raises(ToolkitError, match=r"NaN or infinite values in 2 tensor\(s\)"):
        _model_takers(*images)[name](model)


def _nan(state):
    state["features.0.weight"][0, 0, 0, 0] = float("nan")


def _integer(state):
    state["classifier.2.bias"] = state["classifier.2.bias"].round().to(torch.int64)


def _missing(state):
    del state["classifier.2.bias"]


@pytest.mark.parametrize("name", sorted(_checkpoint_takers(None)))
@pytest.mark.parametrize("hostile, error", [(_nan, "1 tensors hold NaN or infinite values"),
                                            (_integer, "tensor classifier.2.bias is int64, the model's float32"),
                                            (_missing, 'Missing key.*"classifier.2.bias"')])
def test_a_broken_checkpoint_is_refused(tmp_path, name, hostile, error):
    path = _broken(tmp_path, hostile.__name__.strip("_"), hostile)
    with pytest.raises(ToolkitError, match=error):
        _checkpoint_takers(tmp_path)[name](path)


@pytest.mark.parametrize("name", sorted(_checkpoint_takers(None)))
def test_a_checkpoint_stored_in_lower_precision_is_said(tmp_path, name):
    path = _broken(tmp_path, "half", lambda s: s.update({"classifier.2.weight": s["classifier.2.weight"].half()}))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = _checkpoint_takers(tmp_path)[name](path)
    lines = [str(w.message) for w in said if issubclass(w.category, ToolkitWarning)]
    if name == "run_audit":  # the run says it in its log, manifest and report instead
        assert lines == [] and "stored as float16" in result.manifest["warnings"][str(path)][0]
    else:
        assert len(lines) == 1 and "classifier.2.weight stored as float16" in lines[0]


def test_nonfinite_tensors_names_each_tensor_even_where_a_sum_overflows():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        model[0].weight.fill_(3e38)  # finite values whose sum overflows: the exact test decides
    assert nonfinite_tensors(model) == []
    with torch.no_grad():
        model[0].bias[1] = float("-inf")
    model[1].running_var[0] = float("nan")
    assert nonfinite_tensors(model) == ["0.bias", "1.running_var"]
    assert named(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
