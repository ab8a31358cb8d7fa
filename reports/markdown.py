"""report.md: the same sections as index.html, figures linked from figures/."""
from __future__ import annotations

from audit.sections import Section, Table
from reports.tables import rows


def table_markdown(table: Table) -> str:
    header, body = rows(table.frame)
    if not body:
        return "(no rows)"
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def render(title: str, sections: list[Section]) -> str:
    md = [f"# {title}", ""]
    for s in sections:
        md += [f"## {s.title}", ""]
        if s.text:
            md += [s.text, ""]
        md += [f"![{f.name}](figures/{f.name}.png)\n\n*{f.caption}*\n" for f in s.figures]
        if s.figures:
            md.append("")
        for t in s.tables:
            md += [table_markdown(t), ""]
        if s.code:
            md += ["```", s.code, "```", ""]
    return "\n".join(md)
