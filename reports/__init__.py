"""Audit results to HTML / Markdown / LaTeX reports and figures, from one section model."""
from reports.build import build_report, report_sections
from reports.verdict import bort_comparison, verdict_table

__all__ = ["bort_comparison", "build_report", "report_sections", "verdict_table"]
