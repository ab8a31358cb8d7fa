"""A run's plan is frozen; what its execution did is the ledger execute returns and finish reads."""
import dataclasses

import pytest

from audit.run.config import load_config
from audit.run.distributed import SINGLE
from audit.run.execute import execute
from audit.run.finish import finish
from audit.run.plan import opened, plan

CONFIG = dict(models=["cnn-sgd"], methods=["gradient", "guided-backprop"], tests=["random-logit"], n_images=2,
              heatmap_examples=0)


def _planned(out, resume=False):
    return plan(load_config(**CONFIG), out, resume=resume, shard=SINGLE, log=lambda s: None)


def test_the_plan_is_frozen_and_built_by_keyword(tmp_path):
    run = _planned(tmp_path / "run")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.items = ()  # type: ignore[misc]
    assert isinstance(run.items, tuple) and len(run.items) == 2
    with pytest.raises(TypeError):
        type(run)(run.config, run.out)  # type: ignore[misc]


def test_execute_accounts_for_the_units_it_computed_and_only_those(tmp_path):
    run = _planned(tmp_path / "run")
    with opened(run):
        ledger = execute(run, progress=False)
        result = finish(run, ledger)
    assert set(ledger.timings) == set(ledger.peaks) == {"cnn-sgd/random-logit/gradient",
                                                        "cnn-sgd/random-logit/guided-backprop"}
    assert ledger.items == run.items
    assert ledger.placed.model("cnn-sgd") is ledger.placed.model("cnn-sgd")  # moved to the device once
    assert result.manifest["timings_s"] == dict(ledger.timings)
    resumed = _planned(tmp_path / "run", resume=True)
    with opened(resumed):
        again = execute(resumed, progress=False)
        result = finish(resumed, again)
    assert not again.timings  # every unit was written: nothing computed, nothing timed
    assert set(result.manifest["timings_s"]) == set(ledger.timings)  # the first start's times kept


def test_a_ledger_gathered_over_one_process_is_itself(tmp_path):
    run = _planned(tmp_path / "run")
    with opened(run):
        ledger = execute(run, progress=False)
    gathered = ledger.gathered(SINGLE)
    assert gathered.timings == ledger.timings and gathered.peaks == ledger.peaks and gathered.items == ledger.items
    assert gathered.placed is ledger.placed
