"""Writing pipeline outputs so that a crash never leaves a half-written one behind.

Every stage builds its output in a temporary sibling and renames it into place only when complete;
a failure removes the temporary and leaves whatever was there before untouched.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .faults import fault_point


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary folder that becomes `final` when the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    # A killed run (SIGKILL, a scheduler's time limit) leaves its staging folder behind: clear those,
    # and put back an old output it had set aside but not yet replaced.
    for stale in final.parent.glob(f".{final.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for aside in final.parent.glob(f".{final.name}.previous-*"):
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.rename(final)
    staging = final.parent / f".{final.name}.partial-{os.getpid()}"
    staging.mkdir()
    try:
        yield staging
        fault_point(f"publish:{final}")
        # The old output is set aside by a rename, not deleted, until the new one is in place.
        previous = final.parent / f".{final.name}.previous-{os.getpid()}"
        if final.exists():
            final.rename(previous)
        staging.rename(final)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_json(path: str | Path, value: Any) -> None:
    """Write JSON through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.partial-*"):  # left by a killed writer
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
        fault_point(f"publish:{path}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
