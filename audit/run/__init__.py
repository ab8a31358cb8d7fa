"""Running an audit: the configuration, the resumable runner, and reading a run back."""
from audit.run.config import AuditConfig, load_config
from audit.run.results import AuditResult, load_results
from audit.run.runner import run_audit

__all__ = ["AuditConfig", "AuditResult", "load_config", "load_results", "run_audit"]
