"""The Bort optimizers: convergence to orthogonality, SGD / AdamW at gamma 0, state, groups, errors."""
import copy
import io

import pytest
import torch
from torch import nn

from audit.models import build
from bort.corrections import correction
from bort.errors import BortError
from bort.metrics import constraint_error
from bort.optim import Bort, BortAdamW, constrained_parameters, param_groups


def _drive(shape, mode, lr, steps):
    torch.manual_seed(1)
    lin = nn.Linear(shape[1], shape[0], bias=False)
    opt = Bort(lin.parameters(), lr=lr, gamma=1.0, mode=mode, amplitude=1.0)
    for _ in range(steps):
        lin.weight.grad = torch.zeros_like(lin.weight)  # no task gradient: only the constraint acts
        opt.step()
    return constraint_error(lin, amplitude=1.0)


def _sgd_pair(model_a, model_b, opt_a, opt_b, steps=5):
    torch.manual_seed(2)
    for _ in range(steps):
        x = torch.rand(8, 1, 28, 28)
        for model, opt in ((model_a, opt_a), (model_b, opt_b)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()


@pytest.mark.parametrize("shape", [(32, 128), (128, 32)])
def test_zero_task_gradient_reaches_semi_orthogonality(shape):
    err = _drive(shape, "l2-full", lr=0.1, steps=500)
    assert err.side[0] == ("rows" if shape[0] < shape[1] else "columns")
    assert err.orth_error[0] < 1e-3 and err.bound_error[0] < 1e-3
    # The l1 form moves by a fixed step size, so it settles in a band proportional to lr * gamma.
    coarse = _drive(shape, "l1-full-row", lr=1e-2, steps=3000).orth_error[0]
    fine = _drive(shape, "l1-full-row", lr=1e-3, steps=3000).orth_error[0]
    assert coarse < 10 * 1e-2 and fine < 10 * 1e-3 and fine < coarse / 5


def test_gamma_zero_is_exactly_sgd():
    torch.manual_seed(0)
    a = build("cnn")
    b = copy.deepcopy(a)
    _sgd_pair(a, b, Bort(a.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3, gamma=0.0),
              torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_gamma_zero_is_adamw():
    torch.manual_seed(0)
    a = build("cnn")
    b = copy.deepcopy(a)
    _sgd_pair(a, b, BortAdamW(a.parameters(), lr=1e-3, weight_decay=1e-2, gamma=0.0),
              torch.optim.AdamW(b.parameters(), lr=1e-3, weight_decay=1e-2))
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls", [Bort, BortAdamW])
def test_state_dict_round_trip(cls):
    torch.manual_seed(0)
    a = build("cnn")
    b = copy.deepcopy(a)
    opt_a = cls(param_groups(a, 0.05, 1e-3), lr=0.01, **({"momentum": 0.9} if cls is Bort else {}))
    _sgd_pair(a, a, opt_a, opt_a, steps=3)
    b.load_state_dict(a.state_dict())
    opt_b = cls(param_groups(b, 0.05, 1e-3), lr=0.01, **({"momentum": 0.9} if cls is Bort else {}))
    buffer = io.BytesIO()
    torch.save(opt_a.state_dict(), buffer)  # through bytes, as a checkpoint on disk would be
    buffer.seek(0)
    opt_b.load_state_dict(torch.load(buffer, weights_only=True))
    assert opt_b.param_groups[0]["gamma"] == 0.05 and opt_b.param_groups[1]["gamma"] == 0.0
    _sgd_pair(a, b, opt_a, opt_b, steps=3)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_param_groups_leave_biases_and_batchnorm_unconstrained():
    model = build("vgg", batch_norm=True)
    groups = param_groups(model, gamma=0.1, weight_decay=0.0)
    weights = {id(c.parameter) for c in constrained_parameters(model)}
    assert {id(p) for p in groups[0]["params"]} == weights and groups[0]["gamma"] == 0.1
    assert groups[1]["gamma"] == 0.0 and len(groups[1]["params"]) == len(list(model.parameters())) - len(weights)
    before = copy.deepcopy(model.state_dict())
    opt = Bort(groups, lr=0.1, gamma=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = model.state_dict()
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            assert not torch.equal(before[f"{name}.weight"], after[f"{name}.weight"])
            assert torch.equal(before[f"{name}.bias"], after[f"{name}.bias"])
        if isinstance(m, nn.BatchNorm2d):
            assert torch.equal(before[f"{name}.weight"], after[f"{name}.weight"])
            assert torch.equal(before[f"{name}.bias"], after[f"{name}.bias"])


def test_bad_settings_are_clear_errors():
    p = [nn.Parameter(torch.zeros(3, 3))]
    with pytest.raises(BortError, match="unknown Bort mode 'l3-full'"):
        Bort(p, lr=0.1, mode="l3-full")
    with pytest.raises(BortError, match="gamma"):
        Bort(p, lr=0.1, gamma=-0.1)
    with pytest.raises(BortError, match="lr"):
        BortAdamW(p, lr=-1e-3)
    for bad in (float("nan"), float("inf"), 0.0, -1.0, "big"):
        with pytest.raises(BortError, match="amplitude"):
            Bort(p, lr=0.1, amplitude=bad)
    with pytest.raises(BortError, match="gamma"):
        Bort(p, lr=0.1).add_param_group({"params": [nn.Parameter(torch.zeros(2))], "gamma": float("nan")})
    with pytest.raises(BortError, match="momentum"):
        Bort(p, lr=0.1, momentum=1.5)



def test_a_packed_attention_projection_is_constrained_as_three_linear_maps():
    torch.manual_seed(0)
    model = nn.MultiheadAttention(8, 2)
    found = {c.name: c.maps for c in constrained_parameters(model)}
    assert found == {"in_proj_weight": 3, "out_proj.weight": 1}
    groups = param_groups(model, gamma=0.1)
    assert [g.get("maps", 1) for g in groups] == [1, 3, 1] and groups[1]["params"] == [model.in_proj_weight]
    w = model.in_proj_weight.detach().clone()
    opt = Bort(groups, lr=0.5, gamma=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    # each of the query, key and value maps moved by its own correction, not by that of the stacked (24, 8) matrix
    expected = torch.cat([m - 0.5 * 0.1 * correction(m, "l1-full-row") for m in w.chunk(3)])
    torch.testing.assert_close(model.in_proj_weight.detach(), expected, rtol=0, atol=1e-7)
    separate = nn.MultiheadAttention(8, 2, kdim=4, vdim=6)
    assert {c.name: c.maps for c in constrained_parameters(separate)} == {
        "q_proj_weight": 1, "k_proj_weight": 1, "v_proj_weight": 1, "out_proj.weight": 1}
    layers = constraint_error(model).layer.tolist()
    assert layers == ["in_proj.q", "in_proj.k", "in_proj.v", "out_proj"]
