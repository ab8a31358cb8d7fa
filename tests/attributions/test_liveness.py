"""A forward pass made for one backward holds only what the rules read: the same maps, bit for bit,
as a pass that holds every value, in less memory. The small test models' values are all under the
size below which a pass keeps them anyway (``memory.SMALL``): the tests free values of any size."""
import pytest
import torch

from attributions import Explainer, memory
from attributions.liveness import MAX_CHAIN, plan
from audit.models.vit import SmallViT
from tests.engine_zoo import zoo_model

METHODS = ["gradient", "guided-backprop", "deeplift", "lrp-epsilon", "lrp-zplus", "lrp-epsilon-plus", "cp-lrp", "attnlrp"]


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def _models():
    torch.manual_seed(0)
    vit = _perturbed(SmallViT((1, 16, 16), num_classes=5, dim=16, depth=2, heads=2, mlp=32).double())
    return {"vit": (vit, torch.rand(3, 1, 16, 16, dtype=torch.float64)),
            "convnext": (_perturbed(zoo_model("convnext").double()),
                         torch.rand(2, 1, 32, 32, dtype=torch.float64))}


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(memory, "SMALL", 0)


@pytest.mark.parametrize("name", ["vit", "convnext"])
@pytest.mark.parametrize("method", METHODS)
def test_lean_pass_gives_the_full_pass_maps_bit_for_bit(name, method, any_size):
    model, x = _models()[name]
    ex = Explainer(model, method).capture(x)
    ex.by_autograd = False  # the rule chain's lean pass (a chain autograd runs holds what autograd saves)
    lean = ex.attribute(x, target=1)
    full = ex.attribute(x, target=1, _envs=ex._forward_envs(x))  # every value held, every graph recorded
    assert torch.equal(lean, full)
    assert lean.abs().sum() > 0


@pytest.mark.parametrize("method", ["gradient", "deeplift", "lrp-epsilon", "cp-lrp"])
def test_lean_pass_holds_less_and_only_what_rules_read(method, any_size):
    model, x = _models()["vit"]
    ex = Explainer(model, method)
    ex.attribute(x[:1], target=0)
    lean = ex._lean(frozenset({"input"}))
    env, _ = ex._forward_envs(x, lean=lean)
    full, _ = ex._forward_envs(x)
    assert memory.tensor_bytes(env) < 0.8 * memory.tensor_bytes(full)
    freed = {n for names in lean.free.values() for n in names}
    graph = ex.graph
    for node in graph.nodes:
        value = env[node.name]
        if node.name in freed and isinstance(value, torch.Tensor) and value.numel() > 1:
            assert all(s == 0 for s in value.stride()), node.name  # a stand-in: one element of memory
            assert value.shape == full[node.name].shape
        rule = ex._rules.get(node.name)
        if rule is not None and node.name not in lean.remat and node.name in lean.reached:
            reads = rule.reads_for(node)  # what a rule the signal reaches reads is held or recomputed
            for name in (rule.inputs_read(node) if "inputs" in reads else ()) + ((node.name,) if "output" in reads
                                                                                 else ()):
                assert name not in freed or name in lean.remat, (node.name, name)
    # LRP's gate rule holds the attention weights constant: no signal reaches the scores' product or the softmax
    unreached = {graph.by_name[n].kind for n in {n.name for n in graph.nodes} - lean.reached}
    assert ({"product", "softmax"} <= unreached) == (method in ("lrp-epsilon", "cp-lrp")), unreached
    for node in graph.nodes:  # a recorded graph never keeps a value alive that the pass freed
        if (node.name, "graph") in env:
            assert not set(node.inputs) & freed, node.name
    # and one is recorded wherever the signal reaches and the op's inputs are held (cp-lrp frees them all: its
    # factor form reads no value there, and a data-movement VJP runs on stand-ins)
    holding = {n for n in ex.recorded if n in lean.reached and not set(graph.by_name[n].inputs) & freed}
    assert all((name, "graph") in env for name in holding)
    assert bool(holding) == (method != "cp-lrp")


def test_small_values_stay_and_their_graphs_are_recorded():
    model, x = _models()["vit"]
    ex = Explainer(model, "gradient")
    ex.attribute(x[:1], target=0)
    lean = ex._lean(frozenset({"input"}))
    assert lean.freed
    env, _ = ex._forward_envs(x, lean=lean)
    assert not any(memory.is_stand_in(env[name]) for name in lean.freed)
    assert {name for name in ex.recorded if (name, "graph") in env} == set(ex.recorded)


def test_recomputation_chains_are_short_and_read_held_values():
    model, x = _models()["vit"]
    ex = Explainer(model, "lrp-epsilon")
    ex.attribute(x[:1], target=0)
    lean = plan(ex.graph, ex._rules, frozenset({"input"}))
    assert lean.remat  # LayerNorm, GELU, softmax outputs
    freed = {n for names in lean.free.values() for n in names}

    def depth(name):
        node = ex.graph.by_name[name]
        return 1 + max((depth(i) for i in node.inputs if i in lean.remat), default=0)

    for name in lean.remat:
        assert depth(name) <= MAX_CHAIN
        for i in ex.graph.by_name[name].inputs:
            assert i in lean.remat or i not in freed, (name, i)
