"""What every Snakemake script shares: logging into the rule's log file and clear failures."""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import XtrainError
from .recipe import RecipeError

# Python raises OSError(ENOSPC); safetensors and torch.save re-raise a full disk as their own errors, whose
# text is all that tells it.
DISK_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "file write failed")


def disk_full(exc: BaseException | None) -> bool:
    """Whether an error, or one it was raised from, is a full disk or an exhausted quota."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(exc) for text in DISK_FULL_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def recipe_file(smk) -> str:
    """The recipe file of a Snakemake job, for error messages."""
    return str(Path(smk.config["recipes"]) / f"{smk.wildcards.recipe}.yaml")


def run_stage(log_path: str, body: Callable[[], Any], recipe: str | None = None) -> None:
    """Run a stage's body with logging to `log_path` and stderr; a user error, or a full disk, exits 1
    without a traceback. `recipe` (the recipe file) prefixes the message when it does not name it yet."""
    # Libraries log at WARNING and above (their INFO is noise in a rule's log); xtrain at INFO.
    logging.getLogger("xtrain").setLevel(logging.INFO)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
        handlers=[logging.FileHandler(log_path, mode="w"), logging.StreamHandler(sys.stderr)],
        force=True,
    )
    try:
        body()
    except (XtrainError, RecipeError) as exc:
        fail(str(exc), recipe)
    except Exception as exc:
        if not disk_full(exc):
            raise
        fail(
            f"no space left on the device ({type(exc).__name__}: {exc}); no half-written output was kept. Free space "
            "and rerun: outputs already complete are kept, and training resumes from its last complete trainer "
            "checkpoint",
            recipe,
        )


def fail(message: str, recipe: str | None) -> None:
    if recipe and not message.startswith(recipe):
        message = f"{recipe}: {message}"
    logging.getLogger("xtrain").error("%s", message)
    sys.exit(1)
