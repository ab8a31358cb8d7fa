"""A check's options declared once: the declarations, the parsed and checked values, and a verdict that names a
field its options lack."""
from dataclasses import FrozenInstanceError, dataclass

import numpy as np
import pytest

from audit.checks import Check, MedianScore, Options, UnitContext, option
from audit.checks.randomization import CascadingOptions
from audit.checks.stage_options import StageSettings
from audit.errors import ConfigError


@dataclass(frozen=True)
class _Toy(Options):
    level: float = option(0.5, "how high", valid=lambda v: 0 < v <= 1, rule="in (0, 1]")
    mode: str = option("a", "which way", choices=("a", "b"))


def test_declarations_come_from_the_fields_in_order():
    declared = _Toy.declared()
    assert [(o.name, o.default, o.help) for o in declared] == [("level", 0.5, "how high"), ("mode", "a", "which way")]
    assert declared[1].choices == ("a", "b")
    # a subclass's fields follow its base's: the stage keys, then the cascading check's own
    assert [o.name for o in CascadingOptions.declared()] == ["bn", "target", "init", "granularity", "images_per_seed",
                                                             "heatmap_scale",
                                                             "measures", "randomization_top"]


def test_parse_takes_its_own_keys_checks_them_and_widens_ints():
    options = _Toy.parse({"level": 1, "mode": "b", "someone_elses": 3})
    assert options == _Toy(level=1.0, mode="b") and isinstance(options.interval_level, float)
    assert _Toy.parse({}) == _Toy()
    with pytest.raises(ConfigError, match=r"invalid level=2.0: it must be in \(0, 1\]"):
        _Toy.parse({"level": 2})
    with pytest.raises(ConfigError, match="invalid mode='c'; valid: a, b"):
        _Toy.parse({"mode": "c"})
    with pytest.raises(FrozenInstanceError):
        options.interval_level = 0.2  # type: ignore[misc]


def test_stage_settings_are_one_checked_value():
    stages = CascadingOptions.parse({"bn": "keep-stats"}).stages("bottom-up", seed=3)
    assert stages == StageSettings(order="bottom-up", bn="keep-stats", seed=3)
    with pytest.raises(ConfigError, match="granularity"):
        StageSettings(granularity="module")


def test_a_verdict_reading_a_field_its_options_lack_is_refused_when_the_check_is_defined():
    with pytest.raises(TypeError, match="its verdict reads 'toy_threshold', not a field of _Toy"):
        Check(name="toy", title="t", reference="", result_file="toy.csv", columns=["method"],
              run=lambda model, x, y, method, options, unit: None, summary=str,
              sections=lambda table, context, options: [], options=_Toy,
              verdict=MedianScore("toy_score", "toy", "bad", "toy_threshold"))
    assert UnitContext().twins == () and UnitContext(seed=2).seed == 2


def test_a_sequential_design_splits_the_level_over_its_looks_and_keeps_its_error():
    """K looks read each interval at 1 - 0.01 / K (Bonferroni over the looks). 1,000 simulated sequential audits
    of a score whose true median is the threshold itself (the worst case of a check that should not reject): read
    in looks of 16 images up to 64, stopping at the first decided look, they reject in no more than
    one_sided_error(0.99) of them, the error of one fixed-size interval."""
    from scipy import stats

    from audit.checks.base import interval_outcome
    from audit.checks.options import one_sided_error
    from audit.measures.statistics import bootstrap_ci

    assert _Toy.parse({}, looks=4).interval_level == pytest.approx(0.9975) and _Toy.parse({}).interval_level == 0.99
    assert "looks" not in {o.name for o in _Toy.declared()}
    dist, level = stats.beta(2, 5), _Toy.parse({}, looks=4).interval_level
    rng = np.random.default_rng(2)
    rejected = 0
    for _ in range(1000):
        values = dist.rvs(size=64, random_state=rng)
        for look in range(1, 5):
            _, low, high = bootstrap_ci(values[:16 * look], level, n_resamples=2000)  # scored_cell's, fewer draws
            outcome = interval_outcome(low, high, dist.median())
            if outcome != "inconclusive":
                rejected += outcome == "rejected"
                break
    assert rejected / 1000 <= one_sided_error(0.99)


def test_every_threshold_a_verdict_reads_says_where_its_default_comes_from():
    """Each option a check's verdict rules read (the thresholds, the cascading top part) declares its source: a
    citation, a calibration or control measured in the run, or NO_SOURCE; the thresholds without one are listed,
    so that a new threshold cannot pass without saying which it is."""
    from audit.checks import CHECKS
    from audit.checks.options import NO_SOURCE

    sources = {}
    for check in CHECKS.values():
        rules = [r for r in (check.verdict, *check.side_rules) if r is not None]
        declared = {o.name: o for o in check.options.declared()} if check.options is not None else {}
        for rule in rules:
            for name in rule.reads:
                assert declared[name].source, f"{check.name}: {name} declares no source"
                sources[name] = declared[name].source
    assert not {name for name, source in sources.items() if source == NO_SOURCE}
    assert sources["csc_threshold"].startswith("Sixt et al. 2020")
    # the verdicts read on the controls' scale read no threshold at all
    assert {c.name for c in CHECKS.values() if c.verdict is not None and not c.verdict.reads} \
        == {"data-randomization", "smprt", "shortcut"}
    assert CHECKS["cascading"].verdict.reads == ("randomization_top",)
