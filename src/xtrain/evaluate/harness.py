"""lm-evaluation-harness tasks on the base and the tuned model, through the harness's Python API.

The harness loads each model itself from the same folders evaluate uses: the base model folder, and for
the tuned one the base plus the checkpoint's PEFT adapter (`peft=`) or the checkpoint's full weights.
Its results become flat eval.json entries `<base|tuned>_lm_<task>_<metric>` (standard errors and
non-numeric entries left out; a filter other than the default is appended to the metric name).

A task folder (`include_path`) is code as much as data: lm-eval imports the Python its YAMLs name (`!function`, a
`class`, and so an `include` of a YAML elsewhere) and renders their templates with unsandboxed Jinja. Unless the
recipe sets `eval.lm_eval.trust_code`, `check_task_code` refuses such a folder (preflight, and here before lm-eval
reads it), and the templates render in Jinja's sandbox.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from ..errors import XtrainError
from ..recipe import LmEval

log = logging.getLogger(__name__)


class TaskYamlLoader(yaml.SafeLoader):
    """Reads a task YAML as plain data, importing nothing: a tag the safe loader cannot build (lm-eval's `!function`,
    a `!!python/...`) becomes `(tag, line)`."""


TaskYamlLoader.add_constructor(None, lambda loader, node: (node.tag, node.start_mark.line + 1))


def task_code(folder: Path) -> list[str]:
    """Where the task YAMLs in `folder` would make lm-eval run Python: tags, `class` keys, includes of files outside
    the folder (each `<file>:<line>: what`, or `<file>: what`)."""
    folder = folder.resolve()
    found = []
    for file in sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()):
        name = file.relative_to(folder)
        try:
            data = yaml.load(file.read_text(encoding="utf-8"), Loader=TaskYamlLoader)  # noqa: S506 (safe subclass)
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            found.append(f"{name}: not readable as plain YAML ({exc.__class__.__name__})")
            continue
        found += [f"{name}:{where}" for where in code_in(data, file.parent, folder)]
    return found


def code_in(value: Any, here: Path, folder: Path) -> list[str]:
    """What in one YAML's data (from the file in folder `here`) makes lm-eval import Python."""
    if isinstance(value, tuple):
        tag, line = value
        return [f"{line}: tag {tag}"]
    if isinstance(value, list):
        return [where for item in value for where in code_in(item, here, folder)]
    if not isinstance(value, dict):
        return []
    found = [" `class` (a Python task)"] if "class" in value else []
    includes = value.get("include")
    for include in includes if isinstance(includes, list) else [includes] if isinstance(includes, str) else []:
        if not (here / include).resolve().is_relative_to(folder):
            found.append(f" `include: {include}` (a file outside the folder)")
    return found + [where for item in value.values() for where in code_in(item, here, folder)]


def check_task_code(settings: LmEval, project: Path) -> None:
    """Refuse a task folder (`include_path`, relative to `project`) whose YAMLs make lm-eval run Python, unless the
    recipe trusts it (then warn)."""
    if settings.include_path is None:
        return
    if settings.trust_code:
        log.warning("eval.lm_eval.trust_code is set: the Python and templates of the tasks in %s will run",
                    settings.include_path)
        return
    found = task_code(project / settings.include_path)
    if found:
        raise XtrainError(
            f"eval.lm_eval.include_path {settings.include_path!r} holds task YAMLs that make lm-eval run Python "
            f"({'; '.join(found)}): remove that, or set eval.lm_eval.trust_code: true to run it (read the code first)"
        )


def sandbox_task_templates() -> None:
    """Render lm-eval's task templates (`doc_to_text`, ...) in Jinja's sandbox, as chat templates are."""
    from jinja2 import BaseLoader, StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment
    from lm_eval import utils

    env = SandboxedEnvironment(loader=BaseLoader, undefined=StrictUndefined, keep_trailing_newline=True)
    env.filters.update(utils.env.filters)
    utils.env = env


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
    check_task_code(settings, Path())  # the job runs in the project folder, as lm-eval reads include_path
    if not settings.trust_code:
        sandbox_task_templates()
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
    return {**metrics, **({"lm_eval_trust_code": True} if settings.trust_code else {})}
