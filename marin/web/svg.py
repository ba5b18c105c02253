"""Pictures drawn on the server as inline SVG: the step DAG and line charts.

No JavaScript and no charting library: the picture is part of the HTML the server sends,
so it shows in any browser, prints, and costs one pass over the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape as _html_escape
from typing import Any

from .safety import displayable

STATUS_COLOURS = {
    "SUCCESS": ("#d7f0d8", "#2e7d32"),
    "RUNNING": ("#d6e6fb", "#1565c0"),
    "FAILED": ("#fbd9d6", "#c62828"),
    "DEP_FAILED": ("#fde6c8", "#e65100"),
    "UNKNOWN": ("#ececec", "#757575"),
    "MISSING": ("#f5f5f5", "#9e9e9e"),
}
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 190, 36, 22, 54, 16
MAX_PER_ROW = 12
"""A layer wider than this wraps onto several rows (a sweep of 1,000 runs stays readable)."""


@dataclass(frozen=True)
class Node:
    key: str
    """Unique id (the output path)."""

    label: str
    status: str
    href: str
    title: str
    deps: tuple[str, ...]
    """Keys of the nodes this one reads."""


def escape(value: Any) -> str:
    """Text for the picture: any value (labels come from the tree, untrusted), lone surrogates
    spelled as escapes (a UTF-8 page cannot hold them), then HTML-escaped."""
    return _html_escape(displayable(str(value)))


def status_colours(status: str) -> tuple[str, str]:
    return STATUS_COLOURS.get(status, STATUS_COLOURS["UNKNOWN"])


def layer_nodes(nodes: list[Node]) -> list[list[Node]]:
    """Nodes by layer (longest path from a source), ordered to shorten edges."""
    by_key = {node.key: node for node in nodes}
    layer: dict[str, int] = {}
    for node in nodes:  # iterative longest-path; a cycle (never written by the executor) is cut
        stack = [(node.key, False)]
        visiting: set[str] = set()
        while stack:
            key, expanded = stack.pop()
            if key in layer:
                continue
            deps = [dep for dep in by_key[key].deps if dep in by_key and dep != key]
            if expanded:
                visiting.discard(key)
                layer[key] = 1 + max((layer.get(dep, 0) for dep in deps), default=-1)
                continue
            visiting.add(key)
            stack.append((key, True))
            stack.extend((dep, False) for dep in deps if dep not in layer and dep not in visiting)
    layers: list[list[Node]] = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for node in nodes:
        layers[layer[node.key]].append(node)
    # Barycentre ordering, a few sweeps: a node sits near the mean position of its inputs.
    position = {node.key: index for row in layers for index, node in enumerate(row)}
    dependents: dict[str, list[str]] = {}
    for node in nodes:
        for dep in node.deps:
            dependents.setdefault(dep, []).append(node.key)
    for sweep in range(4):
        order = layers[1:] if sweep % 2 == 0 else list(reversed(layers[:-1]))
        for row in order:

            def centre(node: Node, neighbours_of=(sweep % 2 == 0)) -> float:
                near = (
                    [d for d in node.deps if d in position] if neighbours_of else dependents.get(node.key, [])
                )
                near = [key for key in near if key in position]
                return sum(position[key] for key in near) / len(near) if near else position[node.key]

            row.sort(key=centre)
            for index, node in enumerate(row):
                position[node.key] = index
    return layers


def dag_svg(nodes: list[Node]) -> str:
    """The DAG as an SVG: boxes coloured by status (each a link), edges input -> user."""
    if not nodes:
        return '<p class="muted">no steps</p>'
    rows: list[list[Node]] = []
    for row in layer_nodes(nodes):
        rows.extend(row[start : start + MAX_PER_ROW] for start in range(0, len(row), MAX_PER_ROW))
    widest = max(len(row) for row in rows)
    width = MARGIN * 2 + widest * NODE_W + (widest - 1) * GAP_X
    height = MARGIN * 2 + len(rows) * NODE_H + (len(rows) - 1) * GAP_Y
    place: dict[str, tuple[float, float]] = {}
    for depth, row in enumerate(rows):
        row_width = len(row) * NODE_W + (len(row) - 1) * GAP_X
        left = (width - row_width) / 2
        for index, node in enumerate(row):
            place[node.key] = (left + index * (NODE_W + GAP_X), MARGIN + depth * (NODE_H + GAP_Y))
    edges = []
    for node in nodes:
        x2, y2 = place[node.key]
        for dep in node.deps:
            if dep not in place:
                continue
            x1, y1 = place[dep]
            ax, ay, bx, by = x1 + NODE_W / 2, y1 + NODE_H, x2 + NODE_W / 2, y2
            bend = max(20.0, (by - ay) / 2)
            edges.append(
                f'<path class="edge" d="M{ax:.0f},{ay:.0f} C{ax:.0f},{ay + bend:.0f} '
                f'{bx:.0f},{by - bend:.0f} {bx:.0f},{by:.0f}" marker-end="url(#arrow)"/>'
            )
    boxes = []
    for node in nodes:
        x, y = place[node.key]
        fill, stroke = status_colours(node.status)
        text = str(node.label)
        label = text if len(text) <= 26 else text[:25] + "\u2026"
        boxes.append(
            f'<a class="node" href="{escape(node.href)}" data-name="{escape(text)}" '
            f'data-status="{escape(node.status)}"><title>{escape(node.title)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
            f'<text x="{x + NODE_W / 2:.0f}" y="{y + 15:.0f}" text-anchor="middle" class="node-label">'
            f"{escape(label)}</text>"
            f'<text x="{x + NODE_W / 2:.0f}" y="{y + 29:.0f}" text-anchor="middle" class="node-status" '
            f'fill="{stroke}">{escape(node.status)}</text></a>'
        )
    return (
        f'<svg class="dag" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="step graph">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs>'
        f'<g class="edges" fill="none" stroke="#999" stroke-width="1.2">{"".join(edges)}</g>'
        f"<g>{''.join(boxes)}</g></svg>"
    )


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.ceil(low / step) * step
    ticks = []
    value = start
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    return ticks


def tick_label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.1e}"
    return f"{value:g}"


def thin(points: list[tuple[float, float]], limit: int = 1500) -> list[tuple[float, float]]:
    """At most `limit` points, evenly spaced, always keeping the last."""
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    kept = [points[int(index * stride)] for index in range(limit)]
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


SERIES_COLOURS = ("#1565c0", "#e65100", "#2e7d32", "#6a1b9a", "#c62828", "#00838f")


def line_chart(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    width: int = 600,
    height: int = 300,
    x_label: str = "step",
    markers: frozenset[str] = frozenset(),
) -> str:
    """A line chart of named (x, y) series with axes, ticks and a legend."""
    series = {
        name: thin([(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)])
        for name, points in series.items()
    }
    series = {name: points for name, points in series.items() if points}
    if not series:
        return f'<p class="muted">{escape(title)}: no points</p>'
    left, right, top, bottom = 62, 16, 30, 44
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points]
    x_low, x_high = min(xs), max(xs)
    y_low, y_high = min(ys), max(ys)
    if x_high == x_low:
        x_high = x_low + 1
    pad = (y_high - y_low) * 0.05 or abs(y_high) * 0.05 or 1.0
    y_low, y_high = y_low - pad, y_high + pad
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_low) / (y_high - y_low)) * plot_h

    parts = [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#bbb"/>',
        f'<text x="{left}" y="18" class="chart-title">{escape(title)}</text>',
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle" class="axis-label">'
        f"{escape(x_label)}</text>",
    ]
    for tick in nice_ticks(y_low, y_high):
        if y_low <= tick <= y_high:
            y = sy(tick)
            parts.append(
                f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{tick_label(tick)}</text>'
            )
    for tick in nice_ticks(x_low, x_high):
        if x_low <= tick <= x_high:
            x = sx(tick)
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" stroke="#888"/>'
                f'<text x="{x:.1f}" y="{top + plot_h + 17}" text-anchor="middle" class="tick">'
                f"{tick_label(tick)}</text>"
            )
    for index, (name, points) in enumerate(series.items()):
        colour = SERIES_COLOURS[index % len(SERIES_COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline class="series" data-key="{escape(name)}" data-points="{len(points)}" '
            f'fill="none" stroke="{colour}" stroke-width="1.6" points="{coords}"><title>{escape(name)}: '
            f"last {tick_label(points[-1][1])} at {tick_label(points[-1][0])}</title></polyline>"
        )
        if name in markers and len(points) <= 200:
            parts.extend(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.8" fill="{colour}"/>' for x, y in points
            )
        legend_x = left + 8 + index * 150
        parts.append(
            f'<rect x="{legend_x}" y="{top + 6}" width="12" height="3" fill="{colour}"/>'
            f'<text x="{legend_x + 16}" y="{top + 11}" class="legend">{escape(name)}</text>'
        )
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg>'
    )


def interval_chart(
    predicted: float | None,
    interval: tuple[float, float] | None,
    actual: float | None,
    width: int = 420,
    height: int = 64,
) -> str:
    """A prediction on a loss axis: its interval as a band, the predicted value as a diamond,
    the outcome (when there is one) as a dot, green inside the interval and red outside."""
    values = [v for v in (predicted, actual, *(interval or ())) if v is not None and math.isfinite(v)]
    if not values:
        return '<span class="muted">nothing to draw</span>'
    low, high = min(values), max(values)
    pad = (high - low) * 0.15 or abs(high) * 0.02 or 0.1
    low, high = low - pad, high + pad
    left, right, axis_y = 12, 12, 30

    def sx(value: float) -> float:
        return left + (value - low) / (high - low) * (width - left - right)

    parts = [f'<line x1="{left}" x2="{width - right}" y1="{axis_y}" y2="{axis_y}" stroke="#888"/>']
    for tick in nice_ticks(low, high, 4):
        if low <= tick <= high:
            parts.append(
                f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{axis_y}" y2="{axis_y + 4}" stroke="#888"/>'
                f'<text x="{sx(tick):.1f}" y="{axis_y + 17}" text-anchor="middle" class="tick">{tick_label(tick)}</text>'
            )
    if interval is not None:
        a, b = sx(interval[0]), sx(interval[1])
        parts.append(
            f'<rect class="interval" x="{a:.1f}" y="{axis_y - 9}" width="{max(b - a, 1):.1f}" height="18" '
            f'fill="#d6e6fb" stroke="#1565c0"><title>interval {interval[0]:.4f} to {interval[1]:.4f}</title></rect>'
        )
    if predicted is not None and math.isfinite(predicted):
        x = sx(predicted)
        parts.append(
            f'<path class="predicted" d="M{x:.1f},{axis_y - 7} l6,7 l-6,7 l-6,-7 z" fill="#1565c0">'
            f"<title>predicted {predicted:.4f}</title></path>"
        )
    if actual is not None and math.isfinite(actual):
        inside = interval is not None and interval[0] <= actual <= interval[1]
        colour = "#2e7d32" if inside else "#c62828"
        parts.append(
            f'<circle class="actual" cx="{sx(actual):.1f}" cy="{axis_y}" r="5" fill="{colour}" stroke="#fff">'
            f"<title>actual {actual:.4f}</title></circle>"
        )
    return (
        f'<svg class="chart interval-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="prediction and outcome">{"".join(parts)}</svg>'
    )
