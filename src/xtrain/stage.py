"""What every Snakemake script shares: logging into the rule's log file and clear failures."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from .errors import XtrainError
from .recipe import RecipeError


def run_stage(log_path: str, body: Callable[[], Any]) -> None:
    """Run a stage's body with logging to `log_path` and stderr; a user error exits 1 without a traceback."""
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
        logging.getLogger("xtrain").error("%s", exc)
        sys.exit(1)
