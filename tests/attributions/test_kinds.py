"""The node kinds: every kind table of the engine derives from one entry per kind, and a method whose rule
table misses a kind is refused when it is built."""
import dataclasses

import pytest

from attributions import records as rec
from attributions.errors import AttributionError
from attributions.kinds import (
    CONSTANT_KINDS,
    ELEMENTWISE_KINDS,
    KINDS,
    LINEAR_KINDS,
    RECOMPUTED_KINDS,
    RECORDED_KINDS,
    RECORDS,
    SIGNAL_KINDS,
    Kind,
)
from attributions.methods import BUILDERS, build_method


def test_the_tables_derive_from_the_kinds():
    assert set(KINDS) == set(Kind) and all(k == k.value for k in Kind)  # a kind is its name
    assert LINEAR_KINDS == ("dense", "conv", "affine", "avgpool")  # the layers with weights, in this order
    assert set(CONSTANT_KINDS) == {"input", "value", "const"}
    assert set(SIGNAL_KINDS) | set(CONSTANT_KINDS) == set(Kind) and not set(SIGNAL_KINDS) & set(CONSTANT_KINDS)
    assert set(RECOMPUTED_KINDS) == {"move", "activation", "norm", "softmax"}
    assert "reduce" not in RECORDED_KINDS and {"input", "add", "product"} <= set(RECORDED_KINDS)
    assert set(ELEMENTWISE_KINDS) == {"relu", "leaky_relu", "add", "mix", "activation", "product", "softmax"}
    assert RECORDS["softmax"] is rec.Softmax and RECORDS["conv"] is rec.Plain and RECORDS["const"] is rec.Const


def test_every_chain_method_has_a_rule_for_every_signal_kind():
    for name in BUILDERS:
        method = build_method(name)
        if method.chain:
            assert set(SIGNAL_KINDS) <= set(method.rules), name


def test_a_rule_table_that_misses_a_kind_is_refused_naming_the_method_and_the_kind():
    gradient = build_method("gradient")
    rules = {k: v for k, v in gradient.rules.items() if k != "softmax"}
    with pytest.raises(AttributionError, match="method 'partial-gradient'.*no rule for the node kind softmax"):
        dataclasses.replace(gradient, name="partial-gradient", rules=rules)
