"""The audit configuration: flat keys from the registry, type checks, the manifest round trip."""
import pytest

from attributions.methods import BUILDERS
from audit.errors import ConfigError
from audit.run.config import AuditConfig, load_config


def test_defaults_and_check_options_read_by_their_keys():
    config = load_config()
    assert config.tests == ["csc", "random-logit", "cascading"] and config.option("csc_threshold") == 0.99
    assert config.option("bn") == "reset" and config.option("n_vectors") == 5 and config.methods == list(BUILDERS)


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "audit.toml"
    path.write_text('models = ["cnn-sgd"]\nn_images = 8\ncsc_threshold = 1\nbn = "keep-stats"\n')
    config = load_config(path, n_images=6)
    assert config.models == ["cnn-sgd"] and config.n_images == 6 and config.option("bn") == "keep-stats"
    assert config.option("csc_threshold") == 1.0 and isinstance(config.option("csc_threshold"), float)  # an int widens to a float


@pytest.mark.parametrize("values,message", [
    ({"csc_treshold": 0.9}, "unknown configuration key 'csc_treshold'.*Did you mean 'csc_threshold'"),
    ({"bn": "freeze"}, "invalid bn='freeze'; valid: reset, keep-stats"),
    ({"n_vectors": 1}, "invalid n_vectors=1: it must be at least 2"),
    ({"n_vectors": "5"}, "n_vectors must be a int"),
    ({"csc_threshold": 1.5}, r"invalid csc_threshold=1.5: it must be in \(0, 1\]"),
    ({"target": True}, "target must be a str"),
    ({"tests": "csc,random-logt"}, "unknown test 'random-logt'.*Did you mean 'random-logit'"),
    ({"tests": ""}, "no test given"),
    ({"n_images": 1}, "invalid n_images=1"),
    ({"n_images": 4.5}, r"n_images must be a int, got 4.5 \(float\)"),
    ({"seed": "0"}, "seed must be a int, got '0'"),
    ({"seed": -3}, "invalid seed=-3: it must be >= 0"),
    ({"models": {"a": 1}}, "models must be a list of names"),
    ({"models": "cnn-sgd,cnn-sgd"}, "models lists 'cnn-sgd' more than once"),
    ({"methods": ["gradient", "edge", "gradient"]}, "methods lists 'gradient' more than once"),
    ({"tests": ["csc", "csc"]}, "tests lists 'csc' more than once"),
    ({"init": "xavier"}, "invalid init='xavier'; valid: reset, gaussian, permute"),
    ({"emprt_bins": 1}, "invalid emprt_bins=1"),
    ({"device": "gpu"}, "invalid device='gpu'; valid: cpu, cuda"),
    ({"mixed_precision": "yes"}, "mixed_precision must be true or false, got 'yes'"),
    ({"num_classes": 0}, "invalid num_classes=0: it must be a positive integer"),
    ({"weights": 3}, "weights must be a str, got 3"),
    ({"heatmap_examples": 40}, r"heatmap_examples=40 .* at most n_images \(32\)"),
    ({"max_images": 8}, r"max_images must be an integer of at least n_images \(32\)"),
])
def test_bad_values_are_config_errors(values, message):
    with pytest.raises(ConfigError, match=message):
        load_config(**values)


def test_the_manifest_form_is_flat_and_round_trips():
    config = load_config(models="cnn-sgd,cnn-bort", random_logit_threshold=0.4)
    flat = config.to_dict()
    assert "options" not in flat and flat["random_logit_threshold"] == 0.4 and flat["models"] == ["cnn-sgd", "cnn-bort"]
    again = AuditConfig.from_dict(flat).validated()
    assert again.to_dict() == flat
    with pytest.raises(ConfigError, match="unknown check option 'nope'"):
        config.option("nope")


def test_the_configuration_is_frozen_and_reads_a_checks_option_by_its_key():
    import dataclasses

    config = load_config(models="cnn-sgd", n_images=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_images = 8  # type: ignore[misc]
    assert dataclasses.replace(config, n_images=8).validated().n_images == 8 and config.n_images == 4
    with pytest.raises(AttributeError):
        config.csc_threshold  # noqa: B018 - a check's option is no attribute of the configuration
    with pytest.raises(ConfigError, match="unknown check option 'csc_treshold'.*Did you mean 'csc_threshold'"):
        config.option("csc_treshold")
    assert AuditConfig().option("csc_threshold") == load_config().option("csc_threshold")  # the declared default


def test_a_general_key_is_one_declaration_checked_where_it_is_declared():
    """A run-wide key declared once with :func:`key` is a flag, a manifest and TOML key, and its values are
    checked from that declaration alone: a configuration class with one more key refuses its bad values."""
    import dataclasses

    from audit.run.config import AuditConfig, general_keys, key

    @dataclasses.dataclass(frozen=True)
    class Wider(AuditConfig):
        passes: int = key(3, help="a new run-wide key", type=int, valid=lambda v: v >= 1, rule="at least 1")

    assert [f.name for f in general_keys(Wider)] == [f.name for f in general_keys()] + ["passes"]
    assert Wider(passes=2).validated().to_dict()["passes"] == 2
    for bad, message in ((0, "invalid passes=0: it must be at least 1"),
                         ("2", "passes must be a int")):
        with pytest.raises(ConfigError, match=message):
            Wider(passes=bad).validated()


def test_a_retired_threshold_is_refused_with_its_reason_and_an_old_manifest_still_loads():
    with pytest.raises(ConfigError, match="'randomization_threshold' is retired: the verdict reads the controls' scale"):
        load_config(models="cnn-sgd", randomization_threshold=0.4)
    old = {**load_config(models="cnn-sgd").to_dict(), "data_randomization_threshold": 0.5}
    assert "data_randomization_threshold" not in AuditConfig.from_dict(old, recorded=True).validated().to_dict()
