"""What is checked: the sanity checks and their measures, the data and models they run on, and
the runner that puts them together.

Subpackages: ``checks`` (one module per sanity check, a registry), ``measures`` (similarity,
heatmaps, statistics), ``data`` (data sets, formats, downloads), ``models`` (zoo, checkpoints,
training, recipes), ``run`` (configuration, runner, results). The command line (``audit.cli``)
sits above them and the report builder (``reports``).
"""
from typing import TYPE_CHECKING

from attributions.lazy import exports

if TYPE_CHECKING:
    from audit.checks import (
        CHECKS,
        chain_convergence,
        efficient_mprt,
        get_check,
        parameter_randomization,
        random_logit_test,
        randomization_plan,
        randomization_with_maps,
        smooth_mprt,
    )

    # named by their modules: the subpackage has submodules of the same names
    from audit.checks.coverage import coverage
    from audit.checks.data_randomization import data_randomization
    from audit.checks.input_invariance import input_invariance
    from audit.checks.shortcut import shortcut_test
    from audit.data import balanced_sample, embedded_sample, load_dataset
    from audit.data.tags import Tag
    from audit.errors import AuditError, ConfigError, DataError, ModelError
    from audit.measures import bootstrap_ci, heatmaps, spearman, ssim, summarize
    from audit.models import TrainConfig, available_checkpoints, build, load_checkpoint, save_checkpoint, shipped_twin, train
    from audit.run import AuditConfig, AuditResult, load_config, load_results, run_audit

__all__ = ["CHECKS", "AuditConfig", "AuditError", "AuditResult", "ConfigError", "DataError", "ModelError",
           "TrainConfig", "available_checkpoints", "balanced_sample", "bootstrap_ci", "build", "chain_convergence",
           "coverage", "data_randomization", "efficient_mprt", "embedded_sample", "get_check", "heatmaps", "input_invariance",
           "load_checkpoint", "load_config", "load_dataset", "load_results", "parameter_randomization",
           "random_logit_test", "randomization_plan", "randomization_with_maps", "run_audit", "save_checkpoint",
           "shipped_twin", "shortcut_test", "smooth_mprt", "spearman", "ssim", "summarize", "Tag", "train"]
__getattr__, __dir__ = exports(__name__, {
    "CHECKS": "audit.checks", "chain_convergence": "audit.checks", "coverage": "audit.checks",
    "data_randomization": "audit.checks", "efficient_mprt": "audit.checks", "get_check": "audit.checks",
    "input_invariance": "audit.checks", "parameter_randomization": "audit.checks", "random_logit_test":
    "audit.checks", "randomization_plan": "audit.checks", "randomization_with_maps": "audit.checks",
    "smooth_mprt": "audit.checks", "shortcut_test": "audit.checks.shortcut", "Tag": "audit.data.tags",
    "balanced_sample": "audit.data", "embedded_sample": "audit.data",
    "load_dataset": "audit.data", "AuditError": "audit.errors", "ConfigError": "audit.errors", "DataError":
    "audit.errors", "ModelError": "audit.errors", "bootstrap_ci": "audit.measures", "heatmaps": "audit.measures",
    "spearman": "audit.measures", "ssim": "audit.measures", "summarize": "audit.measures", "TrainConfig":
    "audit.models", "available_checkpoints": "audit.models", "build": "audit.models", "load_checkpoint":
    "audit.models", "save_checkpoint": "audit.models", "shipped_twin": "audit.models", "train": "audit.models",
    "AuditConfig": "audit.run", "AuditResult": "audit.run", "load_config": "audit.run", "load_results":
    "audit.run", "run_audit": "audit.run"})
