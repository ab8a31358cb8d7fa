"""index.html: one self-contained page (inline CSS, figures embedded as data URIs, no scripts)."""
from __future__ import annotations

import base64
import html

import pandas as pd

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; }
td.fail { color: #a00; } td.pass { color: #070; }
img { max-width: 100%; margin: 0.5em 0; }
pre { background: #f6f6f6; padding: 1em; font-size: 11px; overflow-x: auto; }
"""


def table_html(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p>(no rows)</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for col, v in zip(df.columns, row):
            text = f"{v:.4g}" if isinstance(v, float) and v == v else ("" if isinstance(v, float) else str(v))
            cls = ""
            if col == "verdict":
                cls = ' class="pass"' if text == "pass" else ' class="fail"'
            cells.append(f"<td{cls}>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def image_html(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, sections: list[tuple[str, str]]) -> str:
    """sections: (heading, inner HTML)."""
    parts = [f"<section><h2>{html.escape(h)}</h2>{body}</section>" for h, body in sections]
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}</body></html>\n")
