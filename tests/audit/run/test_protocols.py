"""The papers' protocols as settings: what each sets, an explicit option over the protocol's, and the report's
statement of what still differs."""
import pytest

from audit.errors import ConfigError
from audit.run.config import AuditConfig, load_config
from audit.run.protocols import PROTOCOLS, overridden
from reports.reproduction import protocol_differences, protocol_note


def test_a_protocol_sets_the_papers_options_and_an_explicit_option_wins():
    plain = load_config()
    def read(config, *keys):
        return tuple(config.option(k) for k in keys)

    assert (plain.protocol, *read(plain, "target", "bn", "init")) == ("toolkit", "true", "reset", "reset")
    adebayo = load_config(protocol="adebayo2018")
    assert read(adebayo, "target", "bn", "init", "data_target") == ("predicted", "keep-stats", "gaussian", "true")
    bent = load_config(protocol="adebayo2018", bn="reset")
    assert bent.option("bn") == "reset" and bent.option("target") == "predicted"
    assert overridden("adebayo2018", bent.options) == ["bn=reset (the protocol: keep-stats)"]
    sixt = load_config(protocol="sixt2020", csc_threshold=0.9)
    assert read(sixt, "n_vectors", "csc_threshold", "bn") == (5, 0.9, "reset")
    # the manifest's flat form keeps both, and reads back the same options
    again = AuditConfig.from_dict(bent.to_dict()).validated()
    assert again.protocol == "adebayo2018" and again.options == bent.options


def test_an_unknown_protocol_is_refused_with_the_nearest_name():
    with pytest.raises(ConfigError, match="unknown protocol 'adebayo'.*Did you mean 'adebayo2018'"):
        load_config(protocol="adebayo")


def test_the_report_says_which_protocol_ran_and_how_it_differs_from_the_paper():
    plain = load_config()
    note = protocol_note(plain, "adebayo2018", protocol_differences("cascading", plain))
    assert note.startswith("Run under the toolkit protocol") and "--protocol adebayo2018 follows the paper" in note
    assert "explained class: the true label (the paper: the randomized model's prediction)" in note
    paper = load_config(protocol="adebayo2018")
    assert protocol_differences("cascading", paper) == []
    note = protocol_note(paper, "adebayo2018", [])
    assert note.startswith("Run under the adebayo2018 protocol") and "set otherwise" not in note
    assert all(text in note for text in PROTOCOLS["adebayo2018"].remaining)
    bent = load_config(protocol="adebayo2018", bn="reset")
    assert "set otherwise by the run: bn=reset (the protocol: keep-stats)" in protocol_note(bent, "adebayo2018", [])
