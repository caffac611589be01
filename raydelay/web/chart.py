"""Bar charts as inline SVG, drawn on the server: the console ships no JavaScript library
and loads nothing from elsewhere."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

WIDTH = 760
HEIGHT = 220
_TOP = 18  # room for the counts above the bars
_BOTTOM = 34  # room for the labels under them
_LEFT = 8


@dataclass(frozen=True)
class Bar:
    label: str
    count: int


def bar_chart(bars: list[Bar], *, title: str, chart_id: str, unit: str = "messages") -> str:
    """An SVG bar chart of ``bars``, one bar per entry, scaled to the largest count. Each
    bar carries its count as ``data-count`` and in a tooltip, and the count is written above
    it, so the picture and the numbers cannot disagree."""
    n = max(len(bars), 1)
    slot = (WIDTH - _LEFT) / n
    bar_w = max(slot * 0.72, 2.0)
    top = max((b.count for b in bars), default=0) or 1
    plot_h = HEIGHT - _TOP - _BOTTOM
    label_every = 1 if n <= 14 else 2
    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="100%" preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{_LEFT}" y1="{HEIGHT - _BOTTOM}" x2="{WIDTH}" y2="{HEIGHT - _BOTTOM}" '
        'class="axis"/>',
    ]
    for i, b in enumerate(bars):
        h = plot_h * b.count / top
        if b.count:
            h = max(h, 1.5)  # one message still shows
        x = _LEFT + i * slot + (slot - bar_w) / 2
        y = HEIGHT - _BOTTOM - h
        label = escape(b.label)
        parts.append(
            f'<g class="bar" data-label="{label}" data-count="{b.count}">'
            f"<title>{label}: {b.count:,} {unit}</title>"
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{max(h, 0.0):.1f}"/>'
        )
        if b.count:
            parts.append(
                f'<text class="count" x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" '
                f'text-anchor="middle">{_short(b.count)}</text>'
            )
        if i % label_every == 0 or i == len(bars) - 1:
            parts.append(
                f'<text class="label" x="{x + bar_w / 2:.1f}" y="{HEIGHT - _BOTTOM + 16}" '
                f'text-anchor="middle">{label}</text>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _short(n: int) -> str:
    """1234 -> 1.2k, 2500000 -> 2.5M: counts that fit over a bar."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n / 1_000_000:.1f}M".replace(".0M", "M")
