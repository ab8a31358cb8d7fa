"""Durations as a reader says them."""
from audit.durations import duration


def test_durations_read_as_a_person_says_them():
    assert (duration(42), duration(125), duration(3 * 3600 + 61), duration(float("nan"))) == \
        ("42 s", "2 min 05 s", "3 h 01 min", "unknown")
