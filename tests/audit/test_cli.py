"""The command line: bad configurations are our own clear errors, exit code 2."""
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
