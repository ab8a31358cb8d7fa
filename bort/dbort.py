"""DBort's data-aware auxiliary loss (the journal extension of Bort)."""
from __future__ import annotations

import torch


def dbort_loss(logits: torch.Tensor, lam: float = 1e-3, beta: float = 0.1) -> torch.Tensor:
    """-lam * mean(logits^2)^beta: rewards output energy, to be added to the task loss.

    Under the Bort constraint it drives a linear layer's rows toward the data's top principal
    directions (in the linear case DBort converges to PCA). Defaults are the reference scripts'.

    Parameters
    ----------
    logits : (B, K) tensor
    lam : the reward's weight
    beta : the exponent of the mean squared logit

    Returns
    -------
    Tensor
        A scalar.
    """
    return -lam * logits.pow(2).mean().pow(beta)
