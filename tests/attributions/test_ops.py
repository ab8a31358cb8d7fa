import operator

import pytest
import torch
from torch import nn

from attributions import ops
from attributions.errors import AttributionError
from attributions.graph import trace
from attributions.records import Activation, Mix, Move, Product


class _Ops(nn.Module):
    """One occurrence of each case the table tells apart by name or by which arguments are signals."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        g = torch.nn.functional.gelu(h)
        s = h + g  # two signals of one shape: a residual sum
        b = s + torch.ones(4)  # a signal and a constant: a linear mix
        p = b * torch.sigmoid(g)  # two signals: a product
        q = torch.full((4,), 2.0) / (p.abs() + 1)  # a constant over a signal: element-wise
        v = torch.cat([q, p], 1).view(-1, 2, 4).flatten(1)
        return nn.functional.dropout(v, training=False).mean(1, keepdim=True)


def _nodes(model, x):
    graph = trace(model, x)
    return {n.name.rsplit(".", 1)[-1]: n for n in graph.nodes}


def test_an_op_is_the_first_entry_that_accepts_it_by_name_and_signal_arguments():
    nodes = _nodes(_Ops().eval(), torch.rand(2, 4))
    assert (nodes["fc"].kind, nodes["gelu"].kind, nodes["gelu"].record) == ("dense", "activation", Activation("gelu"))
    assert nodes["add"].kind == "add" and (nodes["add#1"].kind, nodes["add#1"].record) == ("mix", Mix(elementwise=True))
    assert nodes["mul"].kind == "product" and isinstance(nodes["mul"].record, Product)
    assert nodes["sigmoid"].kind == "activation"
    assert (nodes["div"].kind, nodes["div"].record) == ("activation", Activation("div"))  # 2 / signal
    assert nodes["cat"].record == Move(cat=True) and nodes["view"].record == Move(reshape=True)
    assert nodes["dropout"].record == Move(identity=True) and nodes["mean"].record == Mix()


def test_supported_lists_every_name_of_the_table_and_the_ops_the_builder_shapes():
    named = set().union(*(spec.ops for spec in ops.SPECS if spec.ops is not None))
    listed = set(ops.SUPPORTED.split(": ", 1)[1].split("; ")[0].split(", "))
    assert listed == named | ops.STRUCTURAL
    assert {"conv2d", "batch_norm", "gelu", "cat", "scaled_dot_product_attention", "addcmul"} <= listed
    assert all(spec.about for spec in ops.SPECS)


class _Atan(nn.Module):
    def forward(self, x):
        return torch.atan(x).sum(1, keepdim=True)


def test_adding_an_op_is_one_table_entry(monkeypatch):
    with pytest.raises(AttributionError, match="unsupported operation: aten.atan.default"):
        trace(_Atan(), torch.rand(2, 3))
    entry = ops.OpSpec(frozenset({"atan"}), lambda call: ("activation", Activation(call.op), None),
                       lambda call: call.single, "arctangent of one signal")
    monkeypatch.setattr(ops, "SPECS", (*ops.SPECS, entry))
    graph = trace(_Atan(), torch.rand(2, 3))
    assert [(n.kind, n.record) for n in graph.nodes if n.name == "atan"] == [("activation", Activation("atan"))]


@pytest.mark.parametrize("target,writes", [
    (torch.ops.aten.relu_.default, True), (torch.ops.aten.copy_.default, True), (torch.ops.aten.add_.Tensor, True),
    (torch.ops.aten.relu.default, False), (torch.ops.aten.view.default, False),  # a view aliases without writing
    (torch.ops.aten.batch_norm.default, False),  # writes its running statistics, not its input
    (torch.ops.aten.__iand__.Tensor, False), (operator.getitem, False)])
def test_in_place_ops_are_found_from_the_schema(target, writes):
    assert ops.in_place(target) is writes


def test_an_in_place_op_is_named_and_computed_as_its_out_of_place_form():
    assert ops.op_name(torch.ops.aten.relu_.default) == "relu" == ops.op_name(torch.ops.aten.relu.default)
    assert ops.functional(torch.ops.aten.add_.Tensor) is torch.ops.aten.add.Tensor
    assert ops.functional(torch.ops.aten.relu.default) is torch.ops.aten.relu.default
