"""Models to audit: the architecture zoo, checkpoints (shipped and trained), the trainer, recipes."""
from typing import TYPE_CHECKING

from attributions.lazy import exports

if TYPE_CHECKING:
    from audit.models.catalog import SHIPPED, available_checkpoints
    from audit.models.checkpoint import load_checkpoint, save_checkpoint
    from audit.models.training import OPTIMIZERS, TrainConfig, evaluate, register_optimizer, train
    from audit.models.twins import same_architecture, shipped_twin, shipped_twins, twin_architecture, twin_specs
    from audit.models.zoo import ARCHS, build

__all__ = ["ARCHS", "OPTIMIZERS", "SHIPPED", "TrainConfig", "available_checkpoints", "build", "evaluate",
           "load_checkpoint", "register_optimizer", "same_architecture", "save_checkpoint", "shipped_twin", "train",
           "shipped_twins", "twin_architecture", "twin_specs"]
__getattr__, __dir__ = exports(__name__, {
    "SHIPPED": "audit.models.catalog", "available_checkpoints": "audit.models.catalog",
    "load_checkpoint": "audit.models.checkpoint", "save_checkpoint": "audit.models.checkpoint",
    "OPTIMIZERS": "audit.models.training", "TrainConfig": "audit.models.training", "evaluate": "audit.models.training",
    "register_optimizer": "audit.models.training", "train": "audit.models.training",
    "same_architecture": "audit.models.twins", "shipped_twin": "audit.models.twins",
    "twin_architecture": "audit.models.twins", "twin_specs": "audit.models.twins",
    "shipped_twins": "audit.models.twins", "ARCHS": "audit.models.zoo",
    "build": "audit.models.zoo"})
