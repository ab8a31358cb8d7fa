"""What a reader of an audit must know of its models is said: on loading (a ToolkitWarning and the model's
warnings), then in the run's log, its manifest and its report's Models section."""
import json
import textwrap
import warnings

import pytest
import torch

from attributions.errors import ToolkitWarning
from audit.models import load_checkpoint
from audit.models.cautions import cautions
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports.build import build_report

RUN = dict(methods="gradient", tests="random-logit", n_images=4)


def _half_checkpoint(path):
    model = load_checkpoint("cnn-sgd")
    state = model.state_dict()
    state["classifier.2.weight"] = state["classifier.2.weight"].half()
    torch.save(state, path)
    path.with_suffix(".json").write_text(json.dumps(model.metadata))
    return path


def test_a_checkpoint_stored_in_lower_precision_is_said_at_each_step(tmp_path):
    path = _half_checkpoint(tmp_path / "half.pt")
    with pytest.warns(ToolkitWarning, match="1 tensors of lower precision than the model's float32, cast up on "
                                            "loading: classifier.2.weight stored as float16"):
        model = load_checkpoint(path)
    (line,) = model.metadata["warnings"]
    assert cautions(model) == [line]
    logged = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ToolkitWarning)  # the run says it in its own log, not as a Python warning
        result = run_audit(load_config(models=[str(path)], **RUN), tmp_path / "run", progress=False,
                           log=logged.append)
    assert f"warning: {path}: {line}" in logged
    assert result.manifest["warnings"] == {str(path): [line]}
    report = (build_report(tmp_path / "run").parent / "report.md").read_text()
    assert f"{path}: {line}." in report


def test_an_integer_tensor_where_the_model_computes_in_floating_point_is_refused(tmp_path):
    from audit.errors import ModelError

    model = load_checkpoint("cnn-sgd")
    state = model.state_dict()
    state["classifier.2.bias"] = state["classifier.2.bias"].round().to(torch.int32)
    torch.save(state, tmp_path / "int.pt")
    (tmp_path / "int.json").write_text(json.dumps(model.metadata))
    with pytest.raises(ModelError, match="tensor classifier.2.bias is int32, the model's float32"):
        load_checkpoint(tmp_path / "int.pt")


def test_a_hook_whose_code_cannot_be_read_to_the_end_is_run_with_a_recorded_warning(tmp_path, monkeypatch):
    """An observer that hands its output to a callback the reading cannot name: not refused (the maps are exact
    for the model as its modules compute it), but said in the log, the manifest and the report."""
    (tmp_path / "observed_factory.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        CALLBACKS = {}

        def build():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))

            def observe(module, args, out):
                callback = CALLBACKS.get("conv", print)
                callback(out.shape)

            model[0].register_forward_hook(observe)
            return model.eval()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    logged = []
    result = run_audit(load_config(models=["observed_factory:build"], **RUN), tmp_path / "run", progress=False,
                       log=logged.append)
    (line,) = result.manifest["warnings"]["observed_factory:build"]
    assert line.startswith("0: forward hook build.<locals>.observe may write into its arguments")
    assert "a callable the reading cannot resolve" in line and "without this hook" in line
    assert f"warning: observed_factory:build: {line}" in logged
    assert line in (build_report(tmp_path / "run").parent / "report.md").read_text()


NARROWING_FACTORY = """
    import torch
    from torch import nn

    class Narrowing(nn.Module):  # computes its middle in bfloat16 whatever its inputs' dtype
        def forward(self, x):
            return torch.relu(x.to(torch.bfloat16)).to(x.dtype)

    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 4, 3), Narrowing(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10)).eval()
"""


def test_a_forward_that_narrows_its_values_is_said_with_deeplifts_gap_measured_on_the_audited_images(tmp_path,
                                                                                                 monkeypatch):
    """timm's EfficientViT computes its attention in float32 whatever its dtype: DeepLIFT's rules stay exact, its
    maps miss f(x) - f(x0) by the model's own rounding, and the report says so with the gap measured."""
    from audit.models.cautions import completeness_gap, narrowed_dtypes, narrowing

    (tmp_path / "narrowing_factory.py").write_text(textwrap.dedent(NARROWING_FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    import narrowing_factory

    model = narrowing_factory.build()
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    assert narrowed_dtypes(model, x) == {torch.bfloat16}
    assert narrowed_dtypes(torch.nn.Sequential(*list(model)[:1], torch.nn.ReLU()), x) == set()
    line = narrowing(model, x)
    assert line is not None and line.startswith("computes part of its forward in bfloat16, narrower than its float32")
    worst = float(line.split("miss it by up to ")[1].split()[0])
    assert 1e-4 < worst < 0.1  # bfloat16's rounding (8 bits of mantissa), not an exact sum
    assert f"{completeness_gap(model, x):.1e}" == f"{worst:.1e}"
    from attributions import Explainer

    with torch.no_grad():  # the gap by hand: the maps' sums against the module's own f(x) - f(0)
        logits = model(x)
        target = logits.argmax(1)
        difference = logits[torch.arange(2), target] - model(torch.zeros_like(x))[torch.arange(2), target]
    sums = Explainer(model, "deeplift").attribute(x, target=target).flatten(1).sum(1)
    assert completeness_gap(model, x) == pytest.approx(float(((sums - difference).abs() / difference.abs()).max()),
                                                       rel=1e-3)
    logged = []
    result = run_audit(load_config(models=["narrowing_factory:build", "cnn-sgd"], **(RUN | {"methods": "deeplift"})),
                       tmp_path / "run", progress=False, log=logged.append)
    narrowing_gap, float32_gap = result.tables["models"].deeplift_completeness_gap  # in the run's order
    assert 1e-4 < narrowing_gap < 0.1  # bfloat16's rounding, measured on the run's first two images
    assert float32_gap < 1e-5  # float32 throughout: DeepLIFT's sums to float32 rounding
    (said,) = result.manifest["warnings"]["narrowing_factory:build"]
    assert said.startswith("computes part of its forward in bfloat16") and "of the audited images" in said
    assert f"warning: narrowing_factory:build: {said}" in logged
    assert said in (build_report(tmp_path / "run").parent / "report.md").read_text()
