"""report.md: the same sections as index.html, figures linked from figures/."""
from __future__ import annotations

from audit.sections import Section, Table
from reports.tables import rows


def cell(text: str) -> str:
    """A table cell's text with the characters that would end or break it escaped: "|" and line breaks."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table_markdown(table: Table) -> str:
    header, body = rows(table.frame)
    if not body:
        return "(no rows)"
    lines = ["| " + " | ".join(map(cell, header)) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in body]
    return "\n".join(lines)


def render(title: str, sections: list[Section]) -> str:
    md = [f"# {title}", ""]
    main, appendix = [s for s in sections if not s.appendix], [s for s in sections if s.appendix]
    for s in main + appendix:
        if appendix and s is appendix[0]:
            md += ["# Appendix", ""]
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
