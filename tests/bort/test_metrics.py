"""The constraint error on known answers."""
import pytest
import torch
from torch import nn

from bort.metrics import constraint_error


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

