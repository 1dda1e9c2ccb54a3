"""Progress of a long loop as log lines: done of total, percent, time so far and the time left (ETA).

One line per report, never a carriage return, so it reads the same in `logs/<recipe>/<stage>.log` and on the
console. The stages (prepare, evaluate, export) and the trainers' progress callback all write this line;
standard library only, so the backends' own interpreters can import it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# At most one line per this many seconds (and always the last one): a log file stays readable on long runs.
EVERY_SECONDS = 10.0


def progress_line(what: str, done: int, total: int, elapsed: float, first: int = 0, details: str = "") -> str:
    """`what done/total (percent) details; N s so far, ETA h:mm:ss`, the time left at the mean rate of the
    work since `first` (where a resumed run started)."""
    rate_done = done - first
    left = (total - done) * elapsed / rate_done if rate_done > 0 else None
    eta = "?" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
    share = f"{done / total:.0%}" if total else "?"
    return f"{what} {done}/{total} ({share}){' ' + details if details else ''}; {elapsed:.0f} s so far, ETA {eta}"


class Progress:
    """Count work done towards `total` and write a progress line through `write` (a logger's info) at most every
    `every` seconds, and when the work is complete."""

    def __init__(self, write: Callable[[str], None], what: str, total: int, every: float = EVERY_SECONDS):
        self.write, self.what, self.total, self.every = write, what, total, every
        self.done, self.started = 0, time.monotonic()
        self.last = self.started

    def advance(self, amount: int = 1) -> None:
        self.done += amount
        now = time.monotonic()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            self.write(progress_line(self.what, self.done, self.total, now - self.started))
