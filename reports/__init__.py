"""Audit results to HTML / Markdown / LaTeX reports and figures."""
