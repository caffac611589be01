"""Terminal output shared by the CLI, ingestion and the demo: tables and a progress line."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: numbers right-aligned (with thousands separators), text left."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        all(isinstance(row[i], (int, float)) for row in rows if i < len(row)) and bool(rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)


class ProgressLine:
    """A one-line progress display (rows done, rate, ETA) on a terminal; on anything else
    (a pipe, a CI log) one plain line at most every ``plain_every_s`` seconds."""

    def __init__(
        self,
        what: str,
        total: int | None,
        out: TextIO | None = None,
        plain_every_s: float = 5.0,
    ) -> None:
        self.what = what
        self.total = total
        self.out = out or sys.stderr
        self.start = time.monotonic()
        self._tty = hasattr(self.out, "isatty") and self.out.isatty()
        self._plain_every_s = plain_every_s
        self._last_plain = 0.0
        self._width = 0

    def update(self, done: int, extra: str = "") -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed
        if self.total:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 24)
            eta = (self.total - done) / rate if rate > 0 else float("inf")
            eta_text = f"ETA {eta:,.0f} s" if eta != float("inf") else "ETA ?"
            text = (
                f"{self.what} [{bar:<24}] {done:,}/{self.total:,} {frac:6.1%} "
                f"{rate:,.0f}/s {eta_text}"
            )
        else:
            text = f"{self.what} {done:,} {rate:,.0f}/s {elapsed:,.0f} s"
        if extra:
            text += f"  {extra}"
        if self._tty:
            self.out.write("\r" + text.ljust(self._width))
            self._width = len(text)
        elif time.monotonic() - self._last_plain >= self._plain_every_s:
            self.out.write(text + "\n")
            self._last_plain = time.monotonic()
        self.out.flush()

    def finish(self) -> None:
        if self._tty and self._width:
            self.out.write("\n")
            self.out.flush()
