import copy
import io

import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles
from torch import nn

from audit.errors import ConfigError
from audit.zoo import build
from bort.corrections import MODES, correction, feasible_mode, penalty
from bort.dbort import dbort_loss
from bort.invert import reconstruct, reconstruction_quality
from bort.metrics import constraint_error
from bort.optim import Bort, BortAdamW, constrained_parameters, param_groups


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(5, 12), (12, 5), (7, 7)])
def test_correction_is_the_gradient_of_its_penalty(mode, shape):
    torch.manual_seed(0)
    w = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    grad, = torch.autograd.grad(penalty(w, mode, 1.3), w)
    torch.testing.assert_close(correction(w.detach(), mode, 1.3), grad, rtol=1e-12, atol=1e-12)


def test_l2_full_by_hand():
    w = torch.tensor([[2.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    # W W^T W - cW with c = 1: diag(8 - 2, 1 - 1)
    torch.testing.assert_close(correction(w, "l2-full", 1.0), torch.tensor([[6.0, 0.0], [0.0, 0.0]], dtype=torch.float64))


def test_adaptive_amplitude_is_the_squared_mean_row_norm():
    w = torch.tensor([[3.0, 4.0], [0.0, 1.0]], dtype=torch.float64)  # row norms 5 and 1 -> c = 9
    torch.testing.assert_close(correction(w, "l2-row", "adaptive"), correction(w, "l2-row", 9.0))


def test_row_modes_fall_back_to_columns_for_tall_weights():
    assert feasible_mode("l1-full-row", (128, 32)) == "l1-full-col"
    assert feasible_mode("l1-full-row", (32, 128)) == "l1-full-row"
    assert feasible_mode("l2-full", (128, 32)) == "l2-full"


def _drive(shape, mode, lr, steps):
    torch.manual_seed(1)
    lin = nn.Linear(shape[1], shape[0], bias=False)
    opt = Bort(lin.parameters(), lr=lr, gamma=1.0, mode=mode, amplitude=1.0)
    for _ in range(steps):
        lin.weight.grad = torch.zeros_like(lin.weight)  # no task gradient: only the constraint acts
        opt.step()
    return constraint_error(lin, amplitude=1.0)


@pytest.mark.parametrize("shape", [(32, 128), (128, 32)])
def test_zero_task_gradient_reaches_semi_orthogonality(shape):
    err = _drive(shape, "l2-full", lr=0.1, steps=500)
    assert err.side[0] == ("rows" if shape[0] < shape[1] else "columns")
    assert err.orth_error[0] < 1e-3 and err.bound_error[0] < 1e-3
    # The l1 form moves by a fixed step size, so it settles in a band proportional to lr * gamma.
    coarse = _drive(shape, "l1-full-row", lr=1e-2, steps=3000).orth_error[0]
    fine = _drive(shape, "l1-full-row", lr=1e-3, steps=3000).orth_error[0]
    assert coarse < 10 * 1e-2 and fine < 10 * 1e-3 and fine < coarse / 5


def _sgd_pair(model_a, model_b, opt_a, opt_b, steps=5):
    torch.manual_seed(2)
    for _ in range(steps):
        x = torch.rand(8, 1, 28, 28)
        for model, opt in ((model_a, opt_a), (model_b, opt_b)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()


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
    weights = {id(p) for _, p in constrained_parameters(model)}
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
    with pytest.raises(ConfigError, match="unknown Bort mode 'l3-full'"):
        Bort(p, lr=0.1, mode="l3-full")
    with pytest.raises(ConfigError, match="gamma"):
        Bort(p, lr=0.1, gamma=-0.1)
    with pytest.raises(ConfigError, match="lr"):
        BortAdamW(p, lr=-1e-3)
    for bad in (float("nan"), float("inf"), 0.0, -1.0, "big"):
        with pytest.raises(ConfigError, match="amplitude"):
            Bort(p, lr=0.1, amplitude=bad)
    with pytest.raises(ConfigError, match="gamma"):
        Bort(p, lr=0.1).add_param_group({"params": [nn.Parameter(torch.zeros(2))], "gamma": float("nan")})
    with pytest.raises(ConfigError, match="momentum"):
        Bort(p, lr=0.1, momentum=1.5)


def test_linear_dbort_learns_the_pca_subspace():
    d, k = 8, 2
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
    cov = basis @ np.diag([10, 8, 3, 2, 1, 1, 0.5, 0.5]) @ basis.T
    chol = torch.tensor(np.linalg.cholesky(cov), dtype=torch.float32)
    torch.manual_seed(0)
    lin = nn.Linear(d, k, bias=False)
    opt = Bort(lin.parameters(), lr=0.05, gamma=1.0, mode="l2-full")
    gen = torch.Generator().manual_seed(0)
    for _ in range(1500):
        x = torch.randn(256, d, generator=gen) @ chol.T
        opt.zero_grad()
        dbort_loss(lin(x), lam=1.0, beta=0.1).backward()
        opt.step()
    cosines = np.cos(subspace_angles(lin.weight.detach().double().numpy().T, basis[:, :k]))
    assert cosines.min() >= 0.99, cosines


def test_dbort_loss_value():
    logits = torch.tensor([[1.0, -3.0], [2.0, 0.0]])  # mean of squares = 14 / 4
    assert float(dbort_loss(logits, lam=0.5, beta=0.5)) == pytest.approx(-0.5 * 3.5 ** 0.5)


def test_constraint_error_known_answers():
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    lin = nn.Linear(6, 4, bias=False)
    lin.weight.data = 3.0 * q[:4].float()  # orthogonal rows of norm 3
    err = constraint_error(lin)
    assert err.side[0] == "rows" and err.c[0] == pytest.approx(9.0, rel=1e-5)
    assert err.orth_error[0] < 1e-5 and err.bound_error[0] < 1e-5
    assert constraint_error(lin, amplitude=1.0).bound_error[0] == pytest.approx(2.0, rel=1e-5)
    lin.weight.data = torch.tensor([[1.0, 0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0],
                                    [0, 0, 0, 1.0, 0, 0]])
    # G - I has two off-diagonal ones: ||.||_F / ||I||_F = sqrt(2) / 2
    assert constraint_error(lin).orth_error[0] == pytest.approx(2 ** 0.5 / 2)


def test_orthogonal_conv_reconstructs_its_input_exactly():
    torch.manual_seed(0)
    conv = nn.Conv2d(1, 25, 5, padding=2)
    q, _ = torch.linalg.qr(torch.randn(25, 25))
    conv.weight.data = 2.0 * q.reshape(25, 1, 5, 5)
    model = nn.Sequential(conv, nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(25 * 36, 3))
    x = torch.rand(2, 1, 12, 12)
    before = copy.deepcopy(model.state_dict())
    torch.testing.assert_close(reconstruct(model, x, "0"), x, atol=1e-5, rtol=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    ssim = reconstruction_quality(model, x, "0").ssim
    assert (ssim > 0.999).all()
    random_conv = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2))
    assert (reconstruction_quality(random_conv, x, "0").ssim < 0.99).all()


def test_reconstruct_rejects_branching_models_and_unknown_layers():
    from audit.errors import ModelError

    with pytest.raises(ModelError, match="no module named 'conv9'"):
        reconstruct(build("cnn"), torch.rand(1, 1, 28, 28), "conv9")
    with pytest.raises(ModelError, match="plain chain"):
        reconstruct(build("resnet"), torch.rand(1, 1, 28, 28), "layer1.1.conv1")
