"""The per-kind node records: every kind has one, a node holds the one its kind takes, and tracing fills
them from the exported ops' arguments."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attributions import records as rec
from attributions.graph import Node, trace
from attributions.kinds import CONSTANT_KINDS, RECORDS, SIGNAL_KINDS


def test_every_kind_has_a_record_and_a_node_holds_its_own():
    assert set(RECORDS) == set(SIGNAL_KINDS) | set(CONSTANT_KINDS)
    assert Node("r", "relu", ("x",)).record == rec.Plain()
    assert Node("m", "move", ("x",)).record == rec.Move()
    with pytest.raises(TypeError, match="takes a Softmax record, got Move"):
        Node("s", "softmax", ("x",), record=rec.Move())
    with pytest.raises(TypeError):  # an activation names its function: it has no default
        Node("a", "activation", ("x",))
    with pytest.raises(TypeError, match="unknown kind"):
        Node("q", "quux", ("x",))
    with pytest.raises(dataclasses.FrozenInstanceError):  # a pass makes a new record rather than edit one
        rec.Softmax(1).dim = 2  # type: ignore[misc]


class _Ops(nn.Module):
    """One op of each record-carrying kind, after a BatchNorm folded into its convolution."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.norm = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = F.leaky_relu(self.bn(self.conv(x)), 0.2)
        h = self.norm(h) * torch.sigmoid(h)  # a product whose second operand is a gate
        h = torch.cat([h, F.dropout(h, training=False)], 1)
        h = h.amax(dim=(2, 3)) + F.gelu(h).mean(dim=(2, 3))
        return self.fc(torch.softmax(h, dim=1) * h)


def test_tracing_fills_each_record_from_the_ops_arguments():
    graph = trace(_Ops().eval(), torch.randn(2, 2, 4, 4))
    by_kind: dict[str, list[Node]] = {}
    for node in graph.nodes:
        by_kind.setdefault(node.kind, []).append(node)
    assert [n.record for n in by_kind["leaky_relu"]] == [rec.LeakyReLU(0.2)]
    assert [n.record for n in by_kind["softmax"]] == [rec.Softmax(1)]
    assert [n.record for n in by_kind["reduce"]] == [rec.Reduce((2, 3))]
    assert [n.record.function for n in by_kind["activation"]] == ["sigmoid", "gelu"]
    (norm,) = by_kind["norm"]
    assert norm.record.type == "group" and norm.record.arguments["num_groups"] == 2
    first, second = by_kind["product"]
    assert first.record.gates == (False, True) and second.record.gates == (True, False)
    assert first.record.operands == first.inputs and not first.record.quotient
    moves = [n.record for n in by_kind["move"]]
    assert rec.Move(cat=True) in moves and rec.Move(identity=True) in moves
    (conv,) = by_kind["conv"]
    assert conv.bn is not None and conv.folded == ("bn",) and "bn" not in graph.by_name
    consts = {n.record.attribute for n in graph.nodes if n.kind == "const"}
    assert {"conv.weight", "bn.running_var", "fc.bias"} <= consts
    assert all(n.reads == () for n in graph.nodes if n.kind == "relu")
