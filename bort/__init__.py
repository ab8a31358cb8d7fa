"""Bort / DBort: optimizers that keep weights bounded and orthogonal, and their metrics.

Zhang, Zheng, Zhou, Lu, "Bort: Towards Explainable Neural Networks with Bounded Orthogonal
Constraint" (ICLR 2023) and its data-aware extension DBort.
"""
from bort.corrections import MODES, correction, penalty
from bort.dbort import dbort_loss
from bort.errors import BortError
from bort.invert import reconstruct, reconstruction_quality
from bort.metrics import constraint_error
from bort.optim import Bort, BortAdamW, constrained_parameters, param_groups

__all__ = ["Bort", "BortAdamW", "BortError", "MODES", "constraint_error", "constrained_parameters", "correction",
           "dbort_loss", "param_groups", "penalty", "reconstruct", "reconstruction_quality"]
