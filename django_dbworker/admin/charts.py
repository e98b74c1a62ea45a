"""Bar charts drawn on the server as inline SVG: no script, no CDN, nothing to load.

Each bar is a bucket (a minute or an hour): completed attempts stacked under failed
ones, with a tooltip (``<title>``) giving the bucket's time and figures. Every text is
escaped by ``format_html``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .dashboard import Bucket

WIDTH, HEIGHT = 720, 160
#: Room on the left for the scale, below for the time labels.
LEFT, BOTTOM, TOP = 44, 18, 8
COMPLETED_COLOUR, FAILURES_COLOUR = "#2e7d32", "#c62828"


def _label(start: datetime, fmt: str) -> str:
    return timezone.localtime(start).strftime(fmt)


def bar_chart(buckets: Sequence[Bucket], title: str, fmt: str, every: int) -> SafeString:
    """An SVG bar chart of ``buckets``; every ``every``-th bucket's time (``fmt``)
    labels the axis."""
    top = max((b.completed + b.failures for b in buckets), default=0)
    scale_top = max(top, 1)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(buckets), 1)
    bar_w = max(slot * 0.8, 1.0)
    bars = []
    for i, bucket in enumerate(buckets):
        x = LEFT + i * slot + (slot - bar_w) / 2
        ok_h = plot_h * bucket.completed / scale_top
        bad_h = plot_h * bucket.failures / scale_top
        base = TOP + plot_h
        tip = (
            f"{_label(bucket.start, '%Y-%m-%d %H:%M')}: {bucket.completed} completed, "
            f"{bucket.failures} failed"
        )
        bars.append(
            format_html(
                '<g class="dbworker-bar"><title>{}</title>'
                '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"></rect>'
                '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"></rect></g>',
                tip,
                f"{x:.1f}",
                f"{base - ok_h:.1f}",
                f"{bar_w:.1f}",
                f"{ok_h:.1f}",
                COMPLETED_COLOUR,
                f"{x:.1f}",
                f"{base - ok_h - bad_h:.1f}",
                f"{bar_w:.1f}",
                f"{bad_h:.1f}",
                FAILURES_COLOUR,
            )
        )
    labels = format_html_join(
        "",
        '<text x="{}" y="{}" class="dbworker-axis">{}</text>',
        (
            (f"{LEFT + i * slot:.1f}", HEIGHT - 4, _label(b.start, fmt))
            for i, b in enumerate(buckets)
            if i % every == 0
        ),
    )
    return format_html(
        '<svg class="dbworker-chart" role="img" aria-label="{}" viewBox="0 0 {} {}" '
        'width="{}" height="{}" xmlns="http://www.w3.org/2000/svg">'
        '<text x="0" y="{}" class="dbworker-axis">{}</text>'
        '<text x="0" y="{}" class="dbworker-axis">0</text>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"></line>'
        "{}{}</svg>",
        title,
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
        TOP + 10,
        top,
        TOP + plot_h,
        LEFT,
        TOP + plot_h,
        WIDTH - 4,
        TOP + plot_h,
        format_html_join("", "{}", ((bar,) for bar in bars)),
        labels,
    )
