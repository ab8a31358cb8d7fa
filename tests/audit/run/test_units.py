"""A run's work items and their files: the time left."""
from audit.run.units import remaining_seconds


def test_the_time_left_is_estimated_from_the_units_measured():
    timings = {"cnn-sgd/csc/gradient": 2.0, "cnn-bort/csc/gradient": 4.0, "cnn-sgd/cascading/smoothgrad": 30.0}
    # same test and method: their mean; same test only: its mean; nothing alike: every unit's mean
    left = [("csc", "gradient"), ("cascading", "smoothgrad"), ("cascading", "deeplift"), ("random-logit", "edge")]
    assert remaining_seconds(left, timings) == 3.0 + 30.0 + 30.0 + 12.0
    assert remaining_seconds(left, {}) != remaining_seconds(left, {})  # NaN: nothing measured yet
