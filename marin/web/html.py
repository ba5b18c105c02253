"""HTML building blocks: every value goes through `esc` (html.escape) on its way out."""

from __future__ import annotations

import json
from collections.abc import Iterable
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from .safety import displayable
from .svg import status_colours

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#eceff1;padding:8px 18px;display:flex;gap:18px;align-items:baseline}
header a{color:#eceff1;text-decoration:none;font-weight:600}
header .prefix{color:#b0bec5;font-family:monospace;font-size:12px;margin-left:auto}
main{padding:12px 18px 40px}
.bar{display:inline-block;height:10px;background:#5c6bc0;vertical-align:middle;border-radius:2px}
h1{font-size:20px;margin:6px 0 10px;word-break:break-all}
h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
a{color:#1565c0}
table{border-collapse:collapse;background:#fff;margin:4px 0}
th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #e0e0e0;padding:8px;overflow:auto;max-height:520px;
white-space:pre-wrap;word-break:break-word;margin:4px 0}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;font-weight:600;border:1px solid}
.muted{color:#777}
.pager{margin:10px 0;display:flex;gap:14px}
.dagbox{overflow:auto;border:1px solid #ddd;background:#fff;max-height:80vh}
.dag .node-label{font:12px system-ui,sans-serif;fill:#222}
.dag .node-status{font:10px system-ui,sans-serif}
.dag a:hover rect{stroke-width:3}
.chart .tick,.chart .legend,.chart .axis-label{font:11px system-ui,sans-serif;fill:#555}
.chart .chart-title{font:600 13px system-ui,sans-serif;fill:#222}
.doc{border:1px solid #e0e0e0;background:#fff;margin:8px 0;padding:6px 8px}
.doc pre{max-height:260px}
.compare td{min-width:220px;max-width:420px}
.compare td.dropped{background:#fdecea}
.compare td.gone{background:#f5f5f5;color:#999}
.compare td.unread{background:#f5f5f5;color:#777}
.compare td.changed{background:#fff8e1}
.compare pre{max-height:200px;border:none;padding:0;margin:2px 0}
.mark{font-weight:700;font-size:12px}
.dropped .mark{color:#c62828}
.changed .mark{color:#ef6c00}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:4px 0}
dl.kv dt{font-weight:600;color:#555}
dl.kv dd{margin:0;word-break:break-all}
.charts{display:flex;flex-wrap:wrap;gap:16px}
"""


def esc(value: Any) -> str:
    return escape(displayable("" if value is None else str(value)), quote=True)


def url(route: str, relpath: str = "", **query: Any) -> str:
    """An href: `/route/relpath?query` (relpath percent-encoded, '/' kept).

    A name that is not UTF-8 (see `safety.displayable`) is spelled with backslashes, which
    the server refuses: no URL names it, and callers mark it "not servable" instead."""
    href = "/" + route if route else "/"
    if relpath:
        href += "/" + quote(relpath.strip("/"), safe="/", errors="backslashreplace")
    query = {key: value for key, value in query.items() if value is not None}
    if query:
        href += "?" + urlencode(query)
    return href


def link(href: str, text: Any, cls: str = "") -> str:
    attr = f' class="{esc(cls)}"' if cls else ""
    return f'<a href="{esc(href)}"{attr}>{esc(text)}</a>'


def badge(status: str) -> str:
    fill, stroke = status_colours(status)
    return (
        f'<span class="badge status" data-status="{esc(status)}" '
        f'style="background:{fill};border-color:{stroke};color:{stroke}">{esc(status)}</span>'
    )


def table(header: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """A table whose cells are already HTML (escape values with `esc` first)."""
    head = "".join(f"<th>{esc(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in rows)
    attr = f' class="{esc(cls)}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(cell: str) -> str:
    if cell.startswith("<td"):
        return cell
    return f"<td>{cell}</td>"


def num(value: Any) -> str:
    return f'<td class="num">{esc(value)}</td>'


def kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A definition list; values are HTML."""
    return (
        '<dl class="kv">' + "".join(f"<dt>{esc(key)}</dt><dd>{value}</dd>" for key, value in pairs) + "</dl>"
    )


def pretty_json(value: Any) -> str:
    return f'<pre class="json">{esc(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>'


def pager(prev_href: str | None, next_href: str | None, where: str = "") -> str:
    parts = [
        link(prev_href, "\u2190 previous", "prev")
        if prev_href
        else '<span class="muted">\u2190 previous</span>'
    ]
    if where:
        parts.append(f'<span class="muted">{esc(where)}</span>')
    parts.append(
        link(next_href, "next \u2192", "next") if next_href else '<span class="muted">next \u2192</span>'
    )
    return '<div class="pager">' + "".join(parts) + "</div>"


def page(title: str, body: str, prefix: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)} \u2014 marin browse</title><style>{CSS}</style></head><body>"
        f'<header><a href="/">Experiments</a><a href="/steps">All steps</a><a href="/leaderboard">Leaderboard</a>'
        '<a href="/predictions">Predictions</a>'
        f'<span class="prefix" title="prefix">{esc(prefix)}</span></header>'
        f"<main>{body}</main></body></html>"
    )
