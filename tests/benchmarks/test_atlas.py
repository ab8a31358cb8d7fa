"""The collapse atlas's bookkeeping: the rows kept as each model finishes, resumed, and measured again for
the methods named in ``redo`` (the measurement itself runs in the notebook test, in the libraries' venv)."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

import tests.model_libraries
from benchmarks import atlas as atlas_module
from benchmarks.atlas import FAST_METHODS, FAST_MODELS, RowsError, read_rows


def _fake_measurements(monkeypatch, run: int, crash: set[str] = frozenset(), status: str = "crash"):
    """Replace the measurements by rows whose csc_at_input is ``run`` / 10 plus the calls so far / 1000, one row of
    ``status`` for the models in ``crash``; ``calls`` logs (model, methods)."""
    calls: list[tuple[str, tuple[str, ...]]] = []

    def rows_of(source, name, methods):
        calls.append((name, tuple(methods)))
        if name in crash:
            return [{"source": source, "model": name, "status": status, "reason": "injected"}]
        value = run / 10 + len(calls) / 1000
        return [{"source": source, "model": name, "method": m, "csc_at_input": value, "csc_max": value, "baseline": 0.2,
                 "collapsed": True, "status": "measured", "reason": ""} for m in methods]

    def library_rows(entries, methods, finished=None, **_):
        out = []
        for e, m in zip(entries, methods):
            out += rows_of("timm", e.name, m)
            finished(out[-len(m):] if e.name not in crash else out[-1:])
        return out

    monkeypatch.setattr(atlas_module, "library_rows", library_rows)
    monkeypatch.setattr(atlas_module, "shipped_rows",
                        lambda methods, names, n: [r for name in names for r in rows_of("shipped", name, methods)])
    monkeypatch.setattr(tests.model_libraries, "timm_entries", lambda names: [SimpleNamespace(name=n) for n in names])
    return calls


def test_rows_are_kept_resumed_and_measured_again_for_redo(tmp_path, monkeypatch):
    keep = tmp_path / "atlas-fast.rows.csv"
    calls = _fake_measurements(monkeypatch, 1, crash={FAST_MODELS[1]})
    first = atlas_module.atlas(fast=True, keep=keep)
    assert [c[0] for c in calls] == [*FAST_MODELS, "cnn-sgd", "vit-sgd"]
    kept = pd.read_csv(keep)
    assert len(kept) == len(first) == 3 * len(FAST_METHODS) + 1 and list(kept.status).count("crash") == 1

    calls = _fake_measurements(monkeypatch, 2)  # the crash is gone: that model is tried again, the others are kept
    second = atlas_module.atlas(fast=True, keep=keep)
    assert calls == [(FAST_MODELS[1], tuple(FAST_METHODS))]
    assert set(second[second.status == "measured"].model) == {*FAST_MODELS, "cnn-sgd", "vit-sgd"}

    calls = _fake_measurements(monkeypatch, 3)
    third = atlas_module.atlas(fast=True, keep=keep, redo=["gradient", "no-such-method"])
    assert sorted(calls) == sorted((m, ("gradient",)) for m in [*FAST_MODELS, "cnn-sgd", "vit-sgd"])
    assert len(third) == len(second)
    merged = second.merge(third, on=["model", "method"], suffixes=("_before", "_after"))
    changed = merged[merged.csc_at_input_before != merged.csc_at_input_after]
    assert set(changed.method) == {"gradient"} and len(changed) == 4


def test_a_model_over_the_time_limit_is_kept_as_such_unless_retried(tmp_path, monkeypatch):
    keep = tmp_path / "atlas-fast.rows.csv"
    _fake_measurements(monkeypatch, 1, crash={FAST_MODELS[0]}, status="skipped")
    atlas_module.atlas(fast=True, keep=keep)
    calls = _fake_measurements(monkeypatch, 2)
    second = atlas_module.atlas(fast=True, keep=keep)
    assert calls == [] and list(second[second.model == FAST_MODELS[0]].status) == ["skipped"]
    third = atlas_module.atlas(fast=True, keep=keep, retry=True)
    assert calls == [(FAST_MODELS[0], tuple(FAST_METHODS))]
    assert set(third[third.model == FAST_MODELS[0]].status) == {"measured"}


def test_damaged_kept_rows_are_named_not_resumed_from(tmp_path, monkeypatch, capsys):
    keep = tmp_path / "atlas-fast.rows.csv"
    _fake_measurements(monkeypatch, 1)
    atlas_module.atlas(fast=True, keep=keep)
    rows = pd.read_csv(keep).astype({"csc_at_input": object})
    rows.loc[2, "csc_at_input"] = "oops"
    rows.to_csv(keep, index=False)
    with pytest.raises(RowsError, match=r"row 4 \(.*\) has csc_at_input = 'oops', not a value in \[0, 1\].*--fresh"):
        atlas_module.atlas(fast=True, keep=keep)
    rows.loc[2, "csc_at_input"] = 7.5  # a number no |cos| takes
    rows.to_csv(keep, index=False)
    with pytest.raises(RowsError, match="has csc_at_input = '7.5'"):
        read_rows(keep)
    keep.write_bytes(b"\x00\xff\xfe binary garbage")
    with pytest.raises(RowsError, match="not a CSV of atlas rows|lacks the columns"):
        read_rows(keep)
    monkeypatch.setattr(atlas_module, "figure", lambda table: None)
    assert atlas_module.main(["--fast", "--out", str(tmp_path)]) == 2
    assert "atlas: error:" in capsys.readouterr().err


def test_the_published_atlas_is_small_and_says_where_it_comes_from(tmp_path, monkeypatch):
    import json

    _fake_measurements(monkeypatch, 1, crash={FAST_MODELS[1]})
    table = atlas_module.atlas(fast=True)
    table.loc[0, "csc_at_input"] = 0.123456789
    atlas_module.publish(table, tmp_path / "docs", "python -m benchmarks.atlas --fast", 600.0)
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["atlas.csv", "atlas.json", "atlas.png"]
    published = pd.read_csv(tmp_path / "docs" / "atlas.csv")
    assert len(published) == len(table) and published.csc_at_input[0] == 0.1235
    about = json.loads((tmp_path / "docs" / "atlas.json").read_text())
    assert about["command"] == "python -m benchmarks.atlas --fast" and about["commit"] and about["limit_s"] == 600
    assert about["measured"] == 3 and about["not_measured"] == {FAST_MODELS[1]: "crash: injected"}


def test_redo_on_named_models_measures_only_them_and_the_published_atlas_names_the_earlier_run(tmp_path, monkeypatch):
    import json

    keep = tmp_path / "atlas-fast.rows.csv"
    _fake_measurements(monkeypatch, 1)
    first = atlas_module.atlas(fast=True, keep=keep)
    atlas_module.publish(first, tmp_path / "docs", "python -m benchmarks.atlas --fast", 600.0)
    calls = _fake_measurements(monkeypatch, 2)
    again = atlas_module.atlas(fast=True, keep=keep, redo=["gradient"], models=[FAST_MODELS[0], "vit-sgd"])
    assert sorted(calls) == [(FAST_MODELS[0], ("gradient",)), ("vit-sgd", ("gradient",))]
    merged = first.merge(again, on=["model", "method"], suffixes=("_before", "_after"))
    changed = merged[merged.csc_at_input_before != merged.csc_at_input_after]
    assert sorted(changed.model) == sorted([FAST_MODELS[0], "vit-sgd"]) and set(changed.method) == {"gradient"}
    with pytest.raises(RowsError, match="no rows of no-such-model"):
        atlas_module.atlas(fast=True, keep=keep, redo=["gradient"], models=["no-such-model"])
    atlas_module.publish(again, tmp_path / "docs", "python -m benchmarks.atlas --fast --redo gradient", 600.0,
                         partial=True)
    about = json.loads((tmp_path / "docs" / "atlas.json").read_text())
    assert about["earlier_rows"] == [{"date": about["date"], "commit": about["commit"],
                                      "command": "python -m benchmarks.atlas --fast"}]
