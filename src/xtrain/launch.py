"""Launching a native command (a backend's trainer, pip): an argument list, never a shell string; its
output streamed line by line into the stage's log; a failure that names the command and shows its last lines."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from pathlib import Path

from .errors import XtrainError

log = logging.getLogger(__name__)


def run_command(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> list[str]:
    """Run `command` to completion and return its output lines; `env` adds to (does not replace) this process's
    environment."""
    log.info("launching: %s", shlex.join(command))
    lines: list[str] = []
    with subprocess.Popen(
        command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, bufsize=1,
    ) as process:
        for line in process.stdout:
            line = line.rstrip()
            lines.append(line)
            log.info("| %s", line)
    if process.returncode:
        raise XtrainError(
            f"{shlex.join(command[:4])} ... exited with status {process.returncode}; its last lines:\n"
            + "\n".join(lines[-40:])
        )
    return lines
