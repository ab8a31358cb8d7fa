"""Audit results to HTML / Markdown / LaTeX reports and figures, from one section model."""
from typing import TYPE_CHECKING

from attributions.lazy import exports

if TYPE_CHECKING:
    from reports.build import build_report, report_sections
    from reports.verdict import bort_comparison, verdict_table

__all__ = ["bort_comparison", "build_report", "report_sections", "verdict_table"]
__getattr__, __dir__ = exports(__name__, {"build_report": "reports.build", "report_sections": "reports.build",
                                          "bort_comparison": "reports.verdict", "verdict_table": "reports.verdict"})
