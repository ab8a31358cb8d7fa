"""The unit loop of a sequential run: looks of n_images while a cell is undecided, up to max_images; a run
failing part way through a look finishes, after --resume, with the files of an uninterrupted one."""
import pytest

import audit.run.execute
import audit.run.plan
from audit.checks.base import INCONCLUSIVE
from audit.errors import ConfigError
from audit.run.config import load_config
from audit.run.runner import run_audit
from reports.verdict import verdict_table

BASE = dict(models=["cnn-sgd"], methods=["gradient", "guided-backprop"], tests=["random-logit"], n_images=16,
            max_images=64, heatmap_examples=2)


def _quiet(config, out, **kw):
    return run_audit(config, out, progress=False, log=lambda s: None, **kw)


def test_a_decided_cell_stops_and_an_undecided_one_gets_the_next_look(tmp_path):
    """The gradient's random-logit SSIM (about 0.2) is far below 0.8 and is decided on the first look; guided
    backprop's (about 0.82) sits at the threshold and takes every look up to the budget. The verdict, read from
    the joined tables at the design's level, is the one the run stopped on."""
    result = _quiet(load_config(**BASE), tmp_path / "run")
    assert set(result.manifest["timings_s"]) == {"cnn-sgd/random-logit/gradient@0-16"} | {
        f"cnn-sgd/random-logit/guided-backprop@{a}-{a + 16}" for a in (0, 16, 32, 48)}
    table = result.tables["random-logit"]
    assert table.groupby("method").image.max().to_dict() == {"gradient": 15, "guided-backprop": 63}
    verdict = verdict_table(result.tables, result.config).set_index("method")
    assert verdict.loc["gradient", "random_logit"].startswith("not rejected") and "99.00% interval" not in \
        verdict.loc["gradient", "random_logit"] and "99.75% interval, 16 images" in verdict.loc["gradient", "random_logit"]
    assert "64 images" in verdict.loc["guided-backprop", "random_logit"]
    assert result.config.looks == 4 and result.manifest["config"]["max_images"] == 64
    design = result.manifest["sequential"]
    assert design["looks"] == 4 and design["level"] == pytest.approx(0.9975)
    assert design["images"] == {"cnn-sgd/random-logit/gradient": 16, "cnn-sgd/random-logit/guided-backprop": 64}
    assert not list((tmp_path / "run").rglob("*@*"))  # the looks' blocks are joined into units


def test_a_run_failing_within_a_look_resumes_to_the_same_files(tmp_path, monkeypatch):
    config = load_config(**BASE)
    writes = []
    real = audit.run.execute.atomic_write_bytes

    def failing(path, data):
        writes.append(path)
        if len(writes) == 5:  # within the second look
            raise OSError("disk full")
        real(path, data)

    for module in (audit.run.plan, audit.run.execute):
        monkeypatch.setattr(module, "atomic_write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        _quiet(config, tmp_path / "failed")
    for module in (audit.run.plan, audit.run.execute):
        monkeypatch.setattr(module, "atomic_write_bytes", real)
    _quiet(config, tmp_path / "failed", resume=True)
    fresh = _quiet(config, tmp_path / "fresh")
    for unit in ("gradient", "guided-backprop"):
        path = f"units/cnn-sgd/random-logit/{unit}.csv"
        assert (tmp_path / "failed" / path).read_bytes() == (tmp_path / "fresh" / path).read_bytes()
    assert (tmp_path / "failed/results/random_logit.csv").read_bytes() == \
        (tmp_path / "fresh/results/random_logit.csv").read_bytes()
    assert INCONCLUSIVE not in fresh.tables["random-logit"].columns


def test_a_budget_below_the_look_or_beside_image_blocks_is_refused():
    with pytest.raises(ConfigError, match=r"max_images must be an integer of at least n_images \(16\)"):
        load_config(**{**BASE, "max_images": 3}).validated()
    with pytest.raises(ConfigError, match=r"a look must hold at least 16 images"):
        load_config(**{**BASE, "n_images": 8}).validated()
    with pytest.raises(ConfigError, match="drop image_block"):
        load_config(**BASE, image_block=2).validated()


@pytest.mark.parametrize("method, applies", [("guided-backprop", True), ("attention-rollout", False)])
def test_a_unit_builds_its_methods_explainer_once(monkeypatch, method, applies):
    """The unit's explainer of (model, method) is the check's own: no probe beside it. A method that does not fit
    the model (attention maps of a CNN) leaves the unit empty, from the engine's NotApplicable."""
    import torch

    from attributions.explainer import Explainer
    from audit.checks import CHECKS, UnitContext
    from audit.data import balanced_sample
    from audit.models.checkpoint import resolve_model

    built = []
    real = Explainer.__init__

    def counting(self, model, name, *args, **kwargs):
        built.append(name)
        real(self, model, name, *args, **kwargs)

    monkeypatch.setattr(Explainer, "__init__", counting)
    x, y = balanced_sample("embedded", 2)
    check = CHECKS["random-logit"]
    result = audit.run.execute.run_unit(check, resolve_model("cnn-sgd"), torch.from_numpy(x), torch.from_numpy(y),
                                        method, options=check.options_from({}), unit=UnitContext(), key="k")
    assert built.count(method) == 1
    assert result.table.empty is not applies
    assert list(result.table.columns) == list(check.columns) or applies
