"""What every stage shares: logging into the rule's log file, clear failures, and native commands (a backend's
trainer, pip) launched from an argument list, never a shell string, their output streamed line by line into that
log and a failure naming the command and showing its last lines."""

from __future__ import annotations

import errno
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import XtrainError

log = logging.getLogger(__name__)

# Python raises OSError(ENOSPC); safetensors re-raises a full disk as its own error, with the OS text.
DISK_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded")
# torch.save's zip writer reports a short write without the OS error ("unexpected pos ...", "file write
# failed"); its failures are failed writes, a full disk being by far the likeliest.
FAILED_WRITE_TEXT = ("inline_container.cc",)


def write_failure(exc: BaseException | None) -> str | None:
    """How a failed write shows in an error, or one it was raised from; None if it is not one."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return "no space left on the device"
        if any(text in str(exc) for text in DISK_FULL_TEXT):
            return "no space left on the device"
        if any(text in str(exc) for text in FAILED_WRITE_TEXT):
            return "a write failed, most likely no space left on the device"
        exc = exc.__cause__ or exc.__context__
    return None


def recipe_file(smk) -> str:
    """The recipe file of a Snakemake job, for error messages."""
    return str(Path(smk.config["recipes"]) / f"{smk.wildcards.recipe}.yaml")


def use_threads(threads: int) -> int:
    """Keep this job to the `threads` Snakemake gave it: torch's intra-op pool, OpenMP/MKL in it and in the
    processes it starts, and the tokenizer's Rust pool (read when first used). A smaller OMP_NUM_THREADS
    already set by whoever started the workflow (a test harness, a shared node) is kept."""
    import torch

    inherited = os.environ.get("OMP_NUM_THREADS", "")
    threads = min(threads, int(inherited)) if inherited.isdigit() and int(inherited) > 0 else threads
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ[variable] = str(threads)
    torch.set_num_threads(threads)
    return threads


def run_stage(log_path: str, body: Callable[[], Any], recipe: str | None = None, threads: int | None = None) -> None:
    """Run a stage's body with logging to `log_path` and stderr, on `threads` cores (`use_threads`); a user
    error, or a full disk, exits 1 without a traceback. `recipe` (the recipe file) prefixes the message when it
    does not name it yet."""
    # Libraries log at WARNING and above (their INFO is noise in a rule's log); xtrain at INFO.
    logging.getLogger("xtrain").setLevel(logging.INFO)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        handlers=[logging.FileHandler(log_path, mode="w"), logging.StreamHandler(sys.stderr)],
        force=True,
    )
    # The libraries' progress bars redraw with carriage returns; the stages write progress lines instead.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if threads is not None:
        logging.getLogger("xtrain").info("running on %d thread(s)", use_threads(threads))
    try:
        body()
    except XtrainError as exc:
        fail(str(exc), recipe)
    except Exception as exc:
        failure = write_failure(exc)
        if failure is None:
            # A bug rather than bad input: the traceback goes to the rule's log too, not only to the console.
            logging.getLogger("xtrain").exception("%s", recipe or "stage failed")
            sys.exit(1)
        fail(
            f"{failure} ({type(exc).__name__}: {exc}); no half-written output was kept. Free space and rerun: "
            "outputs already complete are kept, and training resumes from its last complete trainer checkpoint",
            recipe,
        )


def fail(message: str, recipe: str | None) -> None:
    if recipe and not message.startswith(recipe):
        message = f"{recipe}: {message}"
    logging.getLogger("xtrain").error("%s", message)
    sys.exit(1)


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
