"""The command line: bad configurations are our own clear errors, exit code 2."""
import json

import pytest

from audit.cli import main, parser
from audit.errors import ConfigError, ModelError
from audit.run.config import load_config
from audit.run.runner import run_audit

TINY = dict(methods=["gradient", "lrp-zplus", "deeplift", "edge"], tests=["csc", "random-logit", "cascading"],
            n_images=4)


def test_bad_configurations(tmp_path, capsys):
    toml = tmp_path / "audit.toml"
    toml.write_text('models = ["cnn-sgd"]\nn_imagse = 4\n')
    with pytest.raises(ConfigError, match="unknown configuration key 'n_imagse'.*Did you mean 'n_images'"):
        load_config(toml)
    with pytest.raises(ConfigError, match="unknown test 'cascade'.*Did you mean 'cascading'"):
        load_config(tests="csc,cascade")
    with pytest.raises(ConfigError, match="unknown attribution method"):
        load_config(methods="gradient,lrp-zplsu")
    with pytest.raises(ConfigError, match="invalid n_images"):
        load_config(n_images=1)
    assert main(["run", "--models", "no-such-model", "--methods", "gradient", "--tests", "random-logit",
                 "--n-images", "2", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "unknown checkpoint" in capsys.readouterr().err
    with pytest.raises(ModelError, match="cannot build 'nomodule:make'"):
        run_audit(load_config(models=["nomodule:make"], methods=["gradient"], tests=["random-logit"], n_images=2),
                  tmp_path / "y", progress=False, log=lambda s: None)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        run_audit(load_config(models=["cnn-sgd"], **TINY), tmp_path / "busy", progress=False)



def test_no_traceback_reaches_a_cli_user_unless_debug(tmp_path, capsys, monkeypatch):
    args = ["run", "--models", "cnn-sgd", "--methods", "gradient", "--tests", "random-logit", "--n-images", "2",
            "--quiet"]
    (tmp_path / "afile").write_text("x")
    assert main([*args, "--out", str(tmp_path / "afile")]) == 2  # --out is a file
    assert "afile is a file" in capsys.readouterr().err
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code = main([*args, "--out", str(locked / "run")])
        err = capsys.readouterr().err
        if code != 0:  # root may write anywhere: then there is nothing to refuse
            assert code == 2 and "Permission denied" in err and "Traceback" not in err
    finally:
        locked.chmod(0o700)

    def boom(*a, **k):
        raise ZeroDivisionError("division by zero in a user's forward")

    monkeypatch.setattr("audit.run.plan.audit_images", boom)
    assert main([*args, "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "unexpected ZeroDivisionError: division by zero" in err and "--debug" in err and "Traceback" not in err
    with pytest.raises(ZeroDivisionError):
        main(["--debug", *args, "--out", str(tmp_path / "c")])


def test_methods_are_listed_by_family_with_their_bibtex_keys(capsys):
    from attributions.catalog import FAMILIES
    from attributions.methods import BUILDERS, build_method

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert [line[:-1] for line in out.splitlines() if not line.startswith(" ")] == list(FAMILIES)
    for name in BUILDERS:
        line = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert all(f"[{key}]" in line for key in build_method(name).cite), line


def test_every_configuration_key_has_its_flag_from_its_declaration(tmp_path, monkeypatch):
    """The run's flags come from the keys' declarations: each general key and each check option has one, and a
    value given on the command line reaches the configuration."""
    from audit.checks import check_options
    from audit.run.config import general_keys

    run = parser()._subparsers._group_actions[0].choices["run"]
    flags = {a.dest for a in run._actions}
    assert {f.name for f in general_keys()} | set(check_options()) <= flags
    seen = {}

    class Stop(Exception):
        pass

    def stop_before_running(config, out, **kwargs):
        seen["config"] = config
        raise Stop

    monkeypatch.setattr("audit.run.run_audit", stop_before_running)  # the command imports it when it runs
    with pytest.raises(Stop):  # --debug: an unexpected error is raised as it is
        main(["--debug", "run", "--models", "cnn-sgd", "--heatmap-examples", "1", "--n-images", "4",
              "--no-mixed-precision", "--bn", "keep-stats", "--out", str(tmp_path / "r")])
    config = seen["config"]
    assert (config.heatmap_examples, config.n_images, config.mixed_precision, config.option("bn")) == (1, 4, False, "keep-stats")


def test_the_demo_covers_each_family_each_mechanism_and_the_source_papers_checks():
    from attributions.catalog import ATTENTION
    from attributions.methods import BUILDERS, build_method
    from audit.cli import DEMO, DEMO_METHODS, demo_methods
    specs = {m: build_method(m) for m in DEMO_METHODS}
    cnn_families = {build_method(m).family for m in BUILDERS} - {ATTENTION}
    assert {s.family for s in specs.values()} == cnn_families
    # one method for each mechanism the verdict can name: a rank-1 chain, a rectified signal, an input multiplier,
    # and one with none of them (the gradient)
    assert any(s.linear_in_signal and s.family == "LRP z+ family" for s in specs.values())
    assert any(s.rectifies_signal for s in specs.values())
    assert any(s.input_multiplier for s in specs.values())
    assert set(DEMO["tests"]) == {"csc", "random-logit", "cascading", "independent", "data-randomization"}
    everything = demo_methods("all")
    assert set(DEMO_METHODS) < set(everything) and "attention-rollout" not in everything
    with pytest.raises(ConfigError, match="--methods takes 'all'"):
        demo_methods("gradient")
    with pytest.raises(SystemExit):
        parser().parse_args(["demo", "--methods", "some"])


def test_help_and_the_listings_answer_without_importing_torch():
    import subprocess
    import sys
    code = ("import sys\nfrom audit.cli import main\nfor argv in (['--help'], ['demo', '--help'], ['report', '--help'], "
            "['methods'], ['models']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'matplotlib', 'pandas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "demo" in done.stdout and "--pdf" in done.stdout
    assert "lrp-zplus" in done.stdout and "Sixt et al. small CNN" in done.stdout and "cnn-sgd" in done.stdout


def test_a_run_without_its_report_then_the_report_command(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "--models", "cnn-sgd", "--methods", "gradient", "--tests", "random-logit", "--n-images", "2",
            "--quiet", "--out", str(out)]
    assert main([*args, "--no-report"]) == 0
    assert f"attribution-audit report {out}" in capsys.readouterr().out
    assert (out / "results" / "random_logit.csv").exists() and not (out / "index.html").exists()
    assert main(["report", str(out)]) == 0
    assert (out / "index.html").exists()


HOOKED_FACTORY = '''
import functools

import torch
from torch import nn

# the issue's forms, as the reading's cases hold them (their partial is of a stand-in class: this one of torch's)
from tests.attributions.bytecode_cases import bound_method_in_dict as by_dict
from tests.attributions.bytecode_cases import getattr_known_name as by_getattr
from tests.attributions.bytecode_cases import getattr_unknown_name as by_unseen_name
from tests.attributions.bytecode_cases import methodcaller as by_methodcaller


def by_partial(module, args, out):
    functools.partial(torch.Tensor.mul_, out)(2.0)


def build(hook):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    model[0].register_forward_hook(hook)
    return model.eval()
'''


def test_a_hook_that_changes_the_output_is_refused_or_said_for_every_form(tmp_path, capsys, monkeypatch):
    """The forms of a hook doubling a layer's output in place: the one the reading sees is refused by its code, each
    the reading cannot follow by the model's own forward run against the captured graph; both before the run's
    folder is made."""
    unresolved = {"by_unseen_name": "getattr_unknown_name", "by_dict": "bound_method_in_dict",
                  "by_partial": "by_partial", "by_methodcaller": "methodcaller"}
    factories = "".join(f"\n\ndef {form}_model():\n    return build({form})\n" for form in ["by_getattr", *unresolved])
    (tmp_path / "hooked_forms.py").write_text(HOOKED_FACTORY + factories)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["run", "--methods", "gradient", "--tests", "random-logit", "--n-images", "2", "--quiet"]
    assert main([*args, "--models", "hooked_forms:by_getattr_model", "--out", str(tmp_path / "seen")]) == 2
    err = capsys.readouterr().err
    assert "hooks that may change what it computes (0: forward hook getattr_known_name)" in err
    assert not (tmp_path / "seen").exists()
    for form, name in unresolved.items():
        out = tmp_path / form
        assert main([*args, "--models", f"hooked_forms:{form}_model", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"hooked_forms:{form}_model: the model's own forward, its hooks run, gives other logits" in err, err
        assert f"(hooks on the model: 0: forward hook {name})" in err and not out.exists()


def test_a_hook_that_leaves_the_output_is_run_once_more_and_a_failing_one_is_said(tmp_path, capsys, monkeypatch):
    """An observing hook passes the plan's check (it runs once more); a hook under which the model's own forward
    fails leaves nothing compared: a warning line of the log and of the manifest."""
    (tmp_path / "observed.py").write_text(HOOKED_FACTORY + '''

SEEN = []


def observe(module, args, out):
    SEEN.append(out.shape)


def fail(module, args, out):
    SEEN.append(out.shape)
    if len(SEEN) == 1:
        raise RuntimeError("only once")


def observed_model():
    return build(observe)


def failing_model():
    SEEN.clear()
    return build(fail)
''')
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["run", "--methods", "gradient", "--tests", "random-logit", "--n-images", "2", "--quiet", "--no-report"]
    assert main([*args, "--models", "observed:observed_model", "--out", str(tmp_path / "observed")]) == 0
    assert "warnings" not in json.loads((tmp_path / "observed" / "manifest.json").read_text())
    assert main([*args, "--models", "observed:failing_model", "--out", str(tmp_path / "failing")]) == 0
    said = capsys.readouterr()
    assert "warning: observed:failing_model: the model's own forward fails with its hooks" in said.out + said.err
    manifest = json.loads((tmp_path / "failing" / "manifest.json").read_text())
    assert any("fails with its hooks" in line for line in manifest["warnings"]["observed:failing_model"])
