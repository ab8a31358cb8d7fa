"""Audit results to HTML / Markdown / LaTeX reports and figures."""
from reports.build import build_report

__all__ = ["build_report"]
