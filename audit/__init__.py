"""What is checked: data, model zoo, training, and (as they land) the audit tests.

Submodules are imported on first use so that ``import audit`` stays light.
"""
from __future__ import annotations

import importlib

from audit.errors import AuditError, ConfigError, DataError, ModelError

__all__ = ["AuditError", "ConfigError", "DataError", "ModelError", "load_dataset", "embedded_sample",
           "build", "load_checkpoint", "chain_convergence", "random_logit_test", "parameter_randomization",
           "summarize"]

_LAZY = {
    "load_dataset": "audit.data",
    "embedded_sample": "audit.data",
    "build": "audit.zoo",
    "load_checkpoint": "audit.zoo",
    "chain_convergence": "audit.convergence",
    "random_logit_test": "audit.random_logit",
    "parameter_randomization": "audit.randomization",
    "summarize": "audit.summary",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'audit' has no attribute {name!r}")
