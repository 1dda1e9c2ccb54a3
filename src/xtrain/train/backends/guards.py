"""Trainer callbacks that keep a run's work safe: stop on a NaN or infinite loss before it reaches the
weights, mark each trainer checkpoint complete only once it is fully on disk, and the fault points the
robustness tests drive (see `xtrain.faults`).

Any backend built on the transformers Trainer adds `callbacks(...)` to its trainer; `last_complete_checkpoint`
is what a rerun resumes from.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
from pathlib import Path

from xtrain_backend_side.trainer_parts import COMPLETE_MARKER, mark_complete

from ...errors import XtrainError
from ...faults import fault_point, requested

log = logging.getLogger(__name__)
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_complete_checkpoint(run_dir: Path) -> str | None:
    """The newest trainer checkpoint that was completely saved; incomplete ones are removed."""
    if not run_dir.is_dir():
        return None
    steps = {}
    for folder in run_dir.iterdir():
        match = CHECKPOINT.match(folder.name)
        if not (match and folder.is_dir()):
            continue
        if (folder / COMPLETE_MARKER).is_file():
            steps[int(match.group(1))] = folder
        else:
            log.warning("removing %s: it was not completely saved (the run was killed or the disk filled)", folder)
            shutil.rmtree(folder, ignore_errors=True)
    return str(steps[max(steps)]) if steps else None


def callbacks() -> list:
    """The guards every Trainer-based backend runs with."""
    from transformers import TrainerCallback

    class StopOnNonFiniteLoss(TrainerCallback):
        """A NaN or infinite loss makes NaN or infinite gradients: refuse the optimizer step they would
        poison, so neither the weights nor any later checkpoint carries them."""

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            import torch

            for name, param in model.named_parameters():
                if param.grad is not None and not torch.isfinite(param.grad).all():
                    last = last_complete_checkpoint(Path(args.output_dir))
                    raise XtrainError(
                        f"training stopped at optimizer step {state.global_step + 1}: the loss is NaN or infinite "
                        f"(non-finite gradient in {name}); the weights were not updated with it. "
                        + (f"The last good trainer checkpoint is kept in {last}. " if last else
                           "No trainer checkpoint was saved before it. ")
                        + "Lower train.learning_rate or raise train.warmup_ratio, or check the data, then rerun."
                    )

    class FaultPoints(TrainerCallback):
        """Kill the process, or poison the loss, at the optimizer step XTRAIN_FAULT names."""

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            step = state.global_step + 1
            fault_point(f"train_step:{step}")
            if requested() == f"nan_loss:{step}":
                import torch

                with torch.no_grad():
                    next(p for p in model.parameters() if p.requires_grad).fill_(math.nan)

    guards = [mark_complete(), StopOnNonFiniteLoss()]
    return guards + [FaultPoints()] if requested() else guards
