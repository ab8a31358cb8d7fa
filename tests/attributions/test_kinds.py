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


def test_rule_tables_nodes_and_rules_speak_of_kinds_by_the_enum():
    """Every rule table is keyed by Kind (or FIRST, the input's linear layers), every rule names the kinds it acts on
    by Kind, every traced node's kind is a Kind; a kind reads as its name in messages."""
    import torch
    from torch import nn

    from attributions.graph import trace
    from attributions.methods import FIRST

    for name in BUILDERS:
        method = build_method(name)
        assert all(type(k) is Kind or k == FIRST for k in method.rules), name
        assert all(type(k) is Kind for rule in method.rules.values() for k in rule.kinds), name
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)).eval()
    graph = trace(model, torch.rand(1, 1, 4, 4))
    assert [type(n.kind) for n in graph.nodes] == [Kind] * len(graph.nodes)
    assert [n.kind for n in graph.nodes if n.kind != Kind.CONST] == ["input", "conv", "relu", "move", "dense"]
    assert repr(Kind.CONV) == "'conv'" and f"{Kind.CONV}" == "conv"


def test_a_nodes_record_is_read_as_its_type_or_refused():
    import torch
    from torch import nn

    from attributions.graph import trace

    graph = trace(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)).eval(), torch.rand(1, 4))
    flatten, dense = (next(n for n in graph.nodes if n.kind == kind) for kind in (Kind.MOVE, Kind.DENSE))
    assert isinstance(flatten.recorded(rec.Move), rec.Move)
    with pytest.raises(AttributionError, match="records a Plain, not a Product"):
        dense.recorded(rec.Product)
