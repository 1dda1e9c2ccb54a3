"""lm-evaluation-harness tasks on the base and the tuned model, through the harness's Python API.

The harness loads each model itself from the same folders evaluate uses: the base model folder, and for
the tuned one the base plus the checkpoint's PEFT adapter (`peft=`) or the checkpoint's full weights.
Its results become flat eval.json entries `<base|tuned>_lm_<task>_<metric>` (standard errors and
non-numeric entries left out; a filter other than the default is appended to the metric name).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import XtrainError
from ..recipe import LmEval

log = logging.getLogger(__name__)


def model_args(model_dir: Path, checkpoint_dir: Path, which: str, dtype: str = "float32", device: str = "cpu"
               ) -> dict[str, Any]:
    """lm-eval's `hf` model arguments: the folders, and the evaluate job's dtype and placement (`auto`: spread over
    the node's GPUs, lm-eval's `parallelize`)."""
    placement = {"parallelize": True} if device == "auto" else {"device": device}
    args: dict[str, Any] = {"dtype": dtype, **placement, "tokenizer": str(checkpoint_dir)}
    if which == "base":
        return {**args, "pretrained": str(model_dir)}
    if (checkpoint_dir / "adapter_config.json").is_file():
        return {**args, "pretrained": str(model_dir), "peft": str(checkpoint_dir)}
    return {**args, "pretrained": str(checkpoint_dir)}


def flatten(results: dict[str, dict[str, Any]], prefix: str) -> dict[str, float]:
    """{task: {"acc,none": 0.5, "acc_stderr,none": ..., "alias": ...}} -> {"<prefix>_<task>_acc": 0.5}."""
    flat = {}
    for task, values in results.items():
        for key, value in values.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(value, int | float):
                continue
            suffix = metric if filter_name == "none" else f"{metric}_{filter_name}"
            flat[f"{prefix}_lm_{task}_{suffix}"] = float(value)
    return flat


def run_tasks(settings: LmEval, model_dir: Path, checkpoint_dir: Path, batch_size: int, dtype: str = "float32",
              device: str = "cpu") -> dict[str, float]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    include = settings.include_path
    if include is not None and not Path(include).is_dir():
        raise XtrainError(f"eval.lm_eval.include_path {include!r} is not a folder of task YAML files")
    manager = TaskManager(include_path=include)
    missing = [task for task in settings.tasks if task not in manager.all_tasks]
    if missing:
        raise XtrainError(f"eval.lm_eval.tasks {missing}: no such lm-eval task"
                          + (f" (nor in {include})" if include else "") + "; check the names or set include_path")
    metrics: dict[str, float] = {}
    for which in ("base", "tuned"):
        out = lm_eval.simple_evaluate(
            model="hf", model_args=model_args(model_dir, checkpoint_dir, which, dtype, device),
            tasks=list(settings.tasks),
            task_manager=manager, batch_size=batch_size, limit=settings.limit, num_fewshot=settings.num_fewshot,
            log_samples=False, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
        )
        metrics.update(flatten(out["results"], which))
    log.info("lm-eval: %s", metrics)
    return metrics
