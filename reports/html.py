"""index.html: one self-contained page (inline CSS, figures embedded as data URIs, no scripts)."""
from __future__ import annotations

import base64
import html

from audit.sections import Section, Table
from reports.tables import rows

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; }
td.rejected { color: #a00; } td.not-rejected { color: #035; } td.inconclusive { color: #666; }
figure { margin: 1em 0 1.5em; } img { max-width: 100%; }
figcaption { font-size: 12px; color: #444; max-width: 900px; }
pre { background: #f6f6f6; padding: 1em; font-size: 11px; overflow-x: auto; }
details { margin: 0.4em 0; } summary { cursor: pointer; font-weight: 600; font-size: 15px; padding: 0.2em 0; }
figure img { max-height: 80vh; }
"""


def table_html(table: Table) -> str:
    header, body = rows(table.frame)
    if not body:
        return "<p>(no rows)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    lines = []
    for row in body:
        cells = []
        for col, text in zip(header, row):
            cls = ""
            if col == "verdict":
                status = next((s for s in ("rejected", "not rejected", "inconclusive") if text.startswith(s)), "")
                cls = f' class="{status.replace(" ", "-")}"' if status else ""
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def image_html(png: bytes, caption: str) -> str:
    """A figure: the PNG as a data URI, with its caption."""
    source = f"data:image/png;base64,{base64.b64encode(png).decode()}"
    return (f'<figure><img alt="{html.escape(caption)}" src="{source}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def render(title: str, sections: list[Section], pngs: dict[str, bytes]) -> str:
    """The page: each section's text, figures (``pngs``: figure name -> PNG bytes), tables and code; the appendix's
    sections after the main ones, each collapsed under its title (a click opens it)."""
    parts: list[str] = []
    for s in [s for s in sections if not s.appendix] + [s for s in sections if s.appendix]:
        body = f"<p>{html.escape(s.text)}</p>" if s.text else ""
        body += "".join(image_html(pngs[f.name], f.caption) for f in s.figures)
        body += "".join(table_html(t) for t in s.tables)
        body += f"<pre>{html.escape(s.code)}</pre>" if s.code else ""
        if s.appendix:
            opening = "<h2>Appendix</h2>" if not any(p.startswith("<details") for p in parts) else ""
            parts.append(f"{opening}<details><summary>{html.escape(s.title)}</summary>{body}</details>")
        else:
            parts.append(f"<section><h2>{html.escape(s.title)}</h2>{body}</section>")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n")
