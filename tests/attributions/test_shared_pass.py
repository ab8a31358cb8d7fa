import torch

from attributions import Explainer
from attributions.explainer import shared_forward
from attributions.graph import trace
from attributions.shared_pass import CONNECTED, SharedPass


def test_a_reader_gets_the_reference_only_if_it_reads_one_and_the_last_reader_releases_the_pass():
    shared = SharedPass({"x": 1}, {"x": 0})
    assert shared.for_reader(reference=True, last=False) == SharedPass({"x": 1}, {"x": 0}, release=False)
    assert shared.for_reader(reference=False, last=True) == SharedPass({"x": 1}, None, release=True)
    assert not shared.connected and SharedPass({CONNECTED: True}).connected


def test_the_shared_pass_holds_the_reference_where_a_deeplift_method_reads_it():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).double()
    x = torch.rand(2, 4, dtype=torch.float64)
    graph = trace(model, x)
    plain = shared_forward({"gradient": Explainer(model, "gradient", graph=graph)}, x)
    both = shared_forward({m: Explainer(model, m, graph=graph) for m in ("gradient", "deeplift")}, x)
    assert plain is not None and plain.reference is None and not plain.release
    assert both is not None and both.reference is not None and set(both.reference) <= set(both.values)
    torch.testing.assert_close(both.values[graph.output], model(x), rtol=0, atol=0)
