"""DBort: its loss, and linear DBort converging to the PCA subspace."""
import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles
from torch import nn

from bort.dbort import dbort_loss
from bort.optim import Bort


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

