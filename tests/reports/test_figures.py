"""Saving figures: both formats, and no partial file when a write fails."""
import pytest

from audit.sections import Figure, new_figure
from reports.figures import save


def test_save_writes_both_formats_atomically(tmp_path, monkeypatch):
    fig, ax = new_figure(2, 2)
    ax.plot([0, 1], [1, 0])
    png = save(Figure("curve", fig, "a curve"), tmp_path)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "curve.png").read_bytes() == png
    assert (tmp_path / "curve.pdf").read_bytes()[:5] == b"%PDF-"
    old = (tmp_path / "curve.pdf").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(fig, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        save(Figure("curve", fig, "a curve"), tmp_path)
    assert (tmp_path / "curve.pdf").read_bytes() == old  # the old file, never a truncated one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.pdf", "curve.png"]  # no .part left
