"""Models to audit: the architecture zoo, checkpoints (shipped and trained), the trainer, recipes."""
from audit.models.checkpoint import SHIPPED, available_checkpoints, load_checkpoint, save_checkpoint
from audit.models.training import OPTIMIZERS, TrainConfig, evaluate, register_optimizer, train
from audit.models.zoo import ARCHS, build

__all__ = ["ARCHS", "OPTIMIZERS", "SHIPPED", "TrainConfig", "available_checkpoints", "build", "evaluate",
           "load_checkpoint", "register_optimizer", "save_checkpoint", "train"]
