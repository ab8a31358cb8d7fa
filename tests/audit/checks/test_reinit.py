"""Re-initialisation: every tensor kind drawn, only a part's own tensors changed, each draw recorded."""
import copy
import zlib

import pytest
import torch
from torch import nn

from attributions.graph import trace
from audit.checks.randomization import randomization_stages, reinitialise
from audit.checks.reinit import CONSTANT, KEPT, reinitialise_part
from audit.checks.stage_options import StageSettings
from audit.checks.stages import Part, randomization_plan
from audit.errors import AuditError
from audit.models import load_checkpoint
from tests.engine_zoo import zoo_model
from tests.model_libraries import perturb


def _perturbed(model: nn.Module) -> nn.Module:
    # away from every library default, so that a reset to the default cannot look unchanged
    return perturb(model, seed=5).eval()


def _models():
    return {"vit-sgd": (_perturbed(load_checkpoint("vit-sgd")), torch.rand(2, 1, 28, 28)),
            "convnext": (_perturbed(zoo_model("convnext")), torch.rand(2, 1, 32, 32, dtype=torch.float64)),
            "resnet-sgd": (_perturbed(load_checkpoint("resnet-sgd")), torch.rand(2, 1, 28, 28))}


@pytest.mark.parametrize("name", ["vit-sgd", "convnext", "resnet-sgd"])
@pytest.mark.parametrize("init", ["reset", "gaussian", "permute"])
def test_after_the_last_cascading_stage_every_tensor_differs(name, init):
    model, x = _models()[name]
    trained = copy.deepcopy(model.state_dict())
    plan = randomization_plan(model, trace(model, x))
    *_, (_, _, last) = randomization_stages(model, StageSettings(init=init), plan=plan)
    changed = {n for n, p in last.named_parameters() if not torch.equal(p, trained[n])}
    assert changed == set(trained) & {n for n, _ in model.named_parameters()}
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())  # the user's model untouched


def test_cascading_stages_accumulate_and_independent_ones_are_disjoint():
    model, x = _models()["vit-sgd"]
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    plan = randomization_plan(model, trace(model, x), "block")
    seen: set[str] = set()
    for stage, _, m in randomization_stages(model, StageSettings(), plan=plan):
        changed = {n for n, p in m.named_parameters() if not torch.equal(p, trained[n])}
        seen |= set(plan[-stage].tensors) if stage else set()
        assert changed == seen
    for stage, name, m in randomization_stages(model, StageSettings(order="independent"), plan=plan):
        changed = {n for n, p in m.named_parameters() if not torch.equal(p, trained[n])}
        assert changed == (set(plan[-stage].tensors) if stage else set()), name


def test_a_part_changes_its_own_tensors_only():
    # nn.MultiheadAttention's _reset_parameters also zeroes its output projection's bias: drawn on a copy
    model = _perturbed(zoo_model("vit_mha"))
    bias = model.attn.mha.out_proj.bias.detach().clone()
    record = reinitialise_part(model, Part("attn.mha", "attn.mha", ("attn.mha.in_proj_weight", "attn.mha.in_proj_bias")),
                               seed=0)
    assert torch.equal(model.attn.mha.out_proj.bias, bias)
    assert set(record.values()) == {"MultiheadAttention._reset_parameters"} | {
        "MultiheadAttention._reset_parameters" + CONSTANT}  # its input bias: zeros


def test_each_kind_of_tensor_gets_its_documented_draw():
    model, x = _models()["vit-sgd"]
    cls = model.cls.detach().clone()
    plan = {s.name: s for s in randomization_plan(model, trace(model, x), "layer")}
    twin = copy.deepcopy(model)
    record = reinitialise_part(twin, plan["cls"].parts[0], seed=4)
    sigma = float(cls.std())
    assert record == {"cls": f"truncated normal (sigma {sigma:.3g}, the trained tensor's)"}
    assert twin.cls.abs().max() <= 2 * sigma
    # drawn from the generator seeded by (seed, name), whatever the global RNG
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(zlib.crc32(b"4:cls"))
        expected = nn.init.trunc_normal_(torch.empty_like(cls), 0.0, sigma, -2 * sigma, 2 * sigma)
    assert torch.equal(twin.cls, expected)
    record = reinitialise_part(twin, plan["blocks.0.norm1"].parts[0], seed=4)
    assert record == {t: "LayerNorm.reset_parameters" + CONSTANT for t in plan["blocks.0.norm1"].tensors}
    record = reinitialise_part(twin, plan["head"].parts[0], seed=4, init="gaussian")
    assert record == {"head.weight": f"truncated normal (sigma {float(model.head.weight.detach().std()):.3g}, the "
                      "trained tensor's)", "head.bias": "zeros (a bias)" + CONSTANT}


def test_a_layer_stage_draws_what_the_module_own_reset_draws():
    # the draw of earlier versions: the module's reset_parameters under the generator seeded by (seed, name)
    model = load_checkpoint("cnn-sgd")
    layer = copy.deepcopy(model.features[3])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(zlib.crc32(b"7:features.3"))
        layer.reset_parameters()
    reinitialise(model.features[3], "features.3", seed=7)
    assert torch.equal(model.features[3].weight, layer.weight) and torch.equal(model.features[3].bias, layer.bias)


def test_batchnorm_follows_its_policy():
    model, x = _models()["resnet-sgd"]
    plan = randomization_plan(model, trace(model, x), "layer")
    bn_part = plan[0].parts[1]
    assert bn_part.batchnorm and bn_part.path == "bn1"
    twin = copy.deepcopy(model)
    assert reinitialise_part(twin, bn_part, 0, bn="keep-stats") == {"bn1.weight": KEPT, "bn1.bias": KEPT}
    assert torch.equal(twin.bn1.weight, model.bn1.weight)
    reinitialise_part(twin, bn_part, 0, bn="reset")
    assert torch.equal(twin.bn1.weight, torch.ones_like(twin.bn1.weight))
    assert torch.equal(twin.bn1.running_var, torch.ones_like(twin.bn1.running_var))


def test_a_module_without_an_initialiser_is_refused_by_name():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

    with pytest.raises(AuditError, match="'blocks.1' \\(Scale\\) has no reset_parameters"):
        reinitialise(Scale(), "blocks.1", 0)
