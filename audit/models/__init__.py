"""Models to audit: the architecture zoo, checkpoints (shipped and trained), the trainer, recipes."""
from audit.models.checkpoint import SHIPPED, available_checkpoints, load_checkpoint, save_checkpoint
from audit.models.training import OPTIMIZERS, TrainConfig, evaluate, register_optimizer, train
from audit.models.twins import same_architecture, shipped_twin, twin_architecture, twin_spec
from audit.models.zoo import ARCHS, build

__all__ = ["ARCHS", "OPTIMIZERS", "SHIPPED", "TrainConfig", "available_checkpoints", "build", "evaluate",
           "load_checkpoint", "register_optimizer", "same_architecture", "save_checkpoint", "shipped_twin", "train",
           "twin_architecture", "twin_spec"]
