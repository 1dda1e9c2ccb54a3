"""Deterministic fault injection, so the robustness tests kill a real stage at a named point.

`XTRAIN_FAULT=<point>` in a stage's environment makes the process kill itself with SIGKILL (what
`kill -9`, the OOM killer or a scheduler's hard limit do) when it reaches that point; nothing runs
after it, no `finally`, no handler. Unset, every point is a no-op. The points:

- `train_step:<n>`: as optimizer step n begins (guards.FaultPoints);
- `publish:<path>`: when the complete output `<path>` is about to be renamed into place
  (artifacts.atomic_dir and write_json), e.g. `publish:checkpoints/demo` is the train stage's final save;
- `nan_loss:<n>`: not a kill: step n's loss becomes NaN (guards.FaultPoints), to exercise the NaN guard.
"""

from __future__ import annotations

import os
import signal

ENV = "XTRAIN_FAULT"


def requested() -> str | None:
    return os.environ.get(ENV) or None


def fault_point(name: str) -> None:
    """Die here by SIGKILL when `XTRAIN_FAULT` names this point."""
    if requested() == name:
        os.kill(os.getpid(), signal.SIGKILL)
