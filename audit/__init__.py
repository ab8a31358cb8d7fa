"""What is checked: the sanity checks and their measures, the data and models they run on, and
the runner that puts them together.

Subpackages: ``checks`` (one module per sanity check, a registry), ``measures`` (similarity,
heatmaps, statistics), ``data`` (data sets, formats, downloads), ``models`` (zoo, checkpoints,
training, recipes), ``run`` (configuration, runner, results). The command line (``audit.cli``)
sits above them and the report builder (``reports``).
"""
from audit.checks import (
                          CHECKS,
                          chain_convergence,
                          coverage,
                          data_randomization,
                          efficient_mprt,
                          get_check,
                          input_invariance,
                          parameter_randomization,
                          random_logit_test,
                          randomization_plan,
                          randomization_with_maps,
                          smooth_mprt,
)
from audit.data import balanced_sample, embedded_sample, load_dataset
from audit.errors import AuditError, ConfigError, DataError, ModelError
from audit.measures import bootstrap_ci, heatmaps, spearman, ssim, summarize
from audit.models import TrainConfig, available_checkpoints, build, load_checkpoint, save_checkpoint, shipped_twin, train
from audit.run import AuditConfig, AuditResult, load_config, load_results, run_audit

__all__ = ["CHECKS", "AuditConfig", "AuditError", "AuditResult", "ConfigError", "DataError", "ModelError",
           "TrainConfig", "available_checkpoints", "balanced_sample", "bootstrap_ci", "build", "chain_convergence",
           "coverage", "data_randomization", "efficient_mprt", "embedded_sample", "get_check", "heatmaps", "input_invariance",
           "load_checkpoint", "load_config", "load_dataset", "load_results", "parameter_randomization",
           "random_logit_test", "randomization_plan", "randomization_with_maps", "run_audit", "save_checkpoint",
           "shipped_twin", "smooth_mprt", "spearman", "ssim", "summarize", "train"]
