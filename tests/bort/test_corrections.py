"""The Bort corrections against autograd gradients of their penalties, and by hand."""
import pytest
import torch

from bort.corrections import MODES, correction, feasible_mode, penalty
from bort.errors import BortError


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



def test_an_unknown_mode_is_refused_by_the_correction_and_the_penalty():
    w = torch.randn(4, 6)
    for function in (correction, penalty):
        with pytest.raises(BortError, match="unknown Bort mode 'l1-rows'.*Did you mean 'l1-row'"):
            function(w, "l1-rows")
