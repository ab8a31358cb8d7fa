"""The registry of checks: discovery, options, and everything derived from it (configuration, runner,
verdict, CLI, report) picking up a new check with no other change."""
import sys
import textwrap
from dataclasses import dataclass

import pandas as pd
import pytest

from audit.checks import CHECKS, Check, MedianScore, Options, UnitResult, check_options, discover, get_check, option
from audit.cli import parser
from audit.errors import ConfigError
from audit.run.config import load_config
from audit.run.runner import run_audit
from audit.sections import Section
from reports import build_report, verdict_table


def test_registered_checks_in_order_with_their_declarations():
    assert list(CHECKS) == ["csc", "random-logit", "cascading", "independent", "bottom-up", "data-randomization",
                            "emprt", "smprt", "input-invariance", "shortcut"]
    for check in CHECKS.values():
        assert check.result_file.endswith(".csv") and "method" in check.columns and check.title
    assert [c.name for c in CHECKS.values() if c.verdict] == ["csc", "random-logit", "cascading", "data-randomization",
                                                               "emprt", "smprt", "input-invariance", "shortcut"]
    assert {c.name: (c.verdict.score_name, c.verdict.better) for c in CHECKS.values() if c.verdict} == {
        "csc": ("CSC (median |cos| of the chain from the logits)", "lower"), "random-logit": ("SSIM", "lower"),
        "cascading": ("SSIM", "lower"), "data-randomization": ("Spearman of |map|", "lower"),
        "emprt": ("eMPRT score (entropy ratio)", "higher"),
        "smprt": ("Spearman of magnitudes (sMPRT)", "lower"), "input-invariance": ("relative L2 change", "lower"),
        "shortcut": ("share difference", "higher")}
    assert {"n_vectors", "csc_threshold", "random_logit_threshold", "randomization_top",
            "bn", "target", "init", "images_per_seed", "heatmap_scale", "granularity",
            "data_target",
            "emprt_order", "emprt_bins", "emprt_curve", "emprt_threshold", "smprt_order", "smprt_samples", "smprt_noise",
            "measures",
            "shift", "invariance_reference", "invariance_tolerance"} == set(check_options())
    with pytest.raises(ConfigError, match="unknown test 'cascade'.*Did you mean 'cascading'"):
        get_check("cascade")


def test_discovery_finds_every_check_module_of_a_package(tmp_path, monkeypatch):
    package = tmp_path / "fakechecks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, order in (("zeta", 1), ("alpha", 2)):
        (package / f"{name}.py").write_text(textwrap.dedent(f"""
            from audit.checks.base import Check
            CHECK = Check(name="{name}", title="{name}", reference="", result_file="{name}.csv", columns=["method"],
                          run=None, summary=str, sections=lambda t, c, o: [], order={order})
        """))
    (package / "helpers.py").write_text("X = 1\n")  # a module without a check is fine
    monkeypatch.syspath_prepend(str(tmp_path))
    found = discover("fakechecks", [str(package)])
    assert list(found) == ["zeta", "alpha"]
    (package / "twin.py").write_text((package / "zeta.py").read_text())
    sys.modules.pop("fakechecks.twin", None)
    with pytest.raises(RuntimeError, match="two checks share a name"):
        discover("fakechecks", [str(package)])


@dataclass(frozen=True)
class ToyOptions(Options):
    toy_pass: float = option(0.99, "centre share from which a method fails", valid=lambda v: 0 < v <= 1,
                             rule="in (0, 1]")


def _toy_run(model, x, y, method, options, unit):
    # the fraction of the map's magnitude in the image's central half: a toy score per image
    from attributions import Explainer

    maps = Explainer(model, method).attribute(x, target=y).abs().sum(1)
    h, w = maps.shape[1:]
    centre = maps[:, h // 4: 3 * h // 4, w // 4: 3 * w // 4].flatten(1).sum(1) / maps.flatten(1).sum(1).clamp_min(1e-12)
    return UnitResult(pd.DataFrame({"method": method, "image": range(len(x)), "ssim": centre.tolist()}))


TOY = Check(name="toy", title="Toy centre check", reference="none", result_file="toy.csv",
            columns=["method", "image", "ssim"], run=_toy_run, order=99,
            summary=lambda df: f"median centre share {df.ssim.median():.3f}",
            sections=lambda table, context, options: [Section("Toy centre check", f"{len(table)} rows")],
            verdict=MedianScore("toy_score", "toy", "too central", "toy_pass"), options=ToyOptions)


def test_a_new_check_reaches_config_runner_verdict_cli_and_report(tmp_path, monkeypatch):
    monkeypatch.setitem(CHECKS, "toy", TOY)
    with pytest.raises(ConfigError, match="toy_pass must be a float"):
        load_config(models=["cnn-sgd"], tests="toy", toy_pass="high")
    config = load_config(models=["cnn-sgd"], methods="gradient,edge", tests="toy", n_images=4, toy_pass=0.01)
    assert config.option("toy_pass") == 0.01
    result = run_audit(config, tmp_path / "run", progress=False, log=lambda s: None)
    table = pd.read_csv(tmp_path / "run" / "results" / "toy.csv")
    assert set(table.method) == {"gradient", "edge"} and len(table) == 8
    verdict = verdict_table(result.tables, result.config)
    assert set(verdict.verdict) == {"rejected: toy (too central)"} and "toy" in verdict.columns
    html = build_report(tmp_path / "run").read_text()
    assert "<summary>Toy centre check</summary>" in html and "too central" in html  # its section: the appendix
    help_text = parser().format_help() + parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "toy" in help_text and "--toy-pass" in help_text
