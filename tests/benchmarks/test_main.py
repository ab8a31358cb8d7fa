"""``python -m benchmarks --out``: each benchmark's table written with the date, commit and machine it came from."""
from __future__ import annotations

import re
import sys
import types

from benchmarks.__main__ import main


def test_each_table_is_written_with_its_provenance(tmp_path, monkeypatch, capsys):
    fake = types.ModuleType("benchmarks.fake_bench")
    fake.run = lambda: "Fake cost\n\n| method | ratio |\n| --- | --- |\n| gradient | 1.00x |"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.fake_bench", fake)
    assert main(["--out", str(tmp_path / "out"), "fake_bench"]) == 0
    written = (tmp_path / "out" / "fake_bench.md").read_text()
    assert "| gradient | 1.00x |" in written and "| gradient | 1.00x |" in capsys.readouterr().out
    assert re.search(r"Measured \d{4}-\d\d-\d\d \d\d:\d\d UTC at commit \w+.* on \d+ cores .*torch \S+; "
                     r"`python -m benchmarks fake_bench` in \S+\.", written), written
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["fake_bench.md"]  # no temporary file left
