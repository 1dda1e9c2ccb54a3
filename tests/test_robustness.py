"""Nothing lost, nothing run, nothing leaked, through real `snakemake` on a small copy of the project.

Stages are killed by SIGKILL at named points (`XTRAIN_FAULT`, see xtrain.faults): during prepare's
publish, in training's first step, mid-run, during the final save, and in evaluate's publish. A rerun
must resume and end with the adapter of an uninterrupted run. A NaN loss and a full disk (a small tmpfs
mounted on runs/) must stop training with a clear error and keep the last good trainer checkpoint. A
recipe whose data path and fields hold shell syntax must run as plain data. Planted tokens must appear
in no file the pipeline writes. The tests run in file order and share one project.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from conftest import REPO, copy_workflow, snakemake
from safetensors.torch import load_file

from xtrain.artifacts import read_json
from xtrain.train.backends.guards import COMPLETE_MARKER

pytestmark = pytest.mark.slow

SMALL = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/small/chat.jsonl}]
  seq_len: 128
  eval_fraction: 0.2
train: {max_steps: 8, global_batch_size: 4, learning_rate: 5.0e-3, logging_steps: 1}
"""
# The same data under a file name full of shell syntax, and shell syntax in a free-form field: if any
# stage handed them to a shell, PWNED-* files would appear or the canary would go.
INJECTED_NAME = "chat $(touch PWNED-1) `touch PWNED-2`; rm -rf canary"
INJECT = SMALL.replace(
    "sources: [{path: data/small/chat.jsonl}]",
    f"sources: [{{path: 'data/small/{INJECTED_NAME}.jsonl', roles: {{'$(touch PWNED-3); rm -rf canary': assistant}}}}]",
)
SECRETS = {name: f"planted-{name.lower()}-{uuid.uuid4().hex}"
           for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY")}
OUTPUT_DIRS = ("prepared", "plans", "checkpoints", "reports")
CONSOLE: list[str] = []  # everything snakemake printed, scanned for the planted tokens at the end


def run(root: Path, *targets: str, fault: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """snakemake with planted tokens in its environment, and a fault point when given."""
    env = {**SECRETS, **({"XTRAIN_FAULT": fault} if fault else {})}
    result = snakemake(root, *targets, "--cores", "2", check=check, env=env)
    CONSOLE.append(result.stdout + result.stderr)
    return result


def failing(root: Path, fault: str | None, *targets: str) -> str:
    """A run that must fail: killed at `fault`, or failing by itself when None."""
    result = run(root, *targets, "--keep-going", fault=fault, check=False)
    assert result.returncode != 0, f"the run did not fail (fault {fault})"
    return result.stdout + result.stderr


def tree(root: Path, folders=OUTPUT_DIRS) -> dict[str, int]:
    """Every file under the output folders, with its modification time."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for folder in folders if (root / folder).is_dir() for p in (root / folder).rglob("*") if p.is_file()}


def adapter(root: Path, recipe: str = "small") -> dict[str, torch.Tensor]:
    return load_file(root / "checkpoints" / recipe / "adapter_model.safetensors")


def assert_same_adapter(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)


def trainer_checkpoints(root: Path, recipe: str = "small") -> dict[str, bool]:
    """checkpoint-<step> folders of the interrupted run -> whether each was completely saved."""
    return {folder.name: (folder / COMPLETE_MARKER).is_file()
            for folder in sorted((root / "runs" / recipe).glob("*/checkpoint-*"))}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("robust"), {"small": SMALL, "inject": INJECT})
    rows = "\n".join((REPO / "data/demo/chat.jsonl").read_text().splitlines()[:60]) + "\n"
    (root / "data/small").mkdir()
    (root / "data/small/chat.jsonl").write_text(rows)
    (root / f"data/small/{INJECTED_NAME}.jsonl").write_text(rows)
    (root / "canary").write_text("no recipe may delete this\n")
    return root


def test_prepare_killed_while_publishing_leaves_no_output_and_spares_the_other_recipe(project):
    # Both recipes prepare at once (--cores 2); only small's prepare is killed.
    failing(project, "publish:prepared/small", "plans/small/plan.json", "plans/inject/plan.json")
    assert not (project / "prepared/small").exists()
    assert list((project / "prepared").glob(".small.partial-*")), "the kill came mid-publish: its staging is left"
    assert (project / "plans/inject/plan.json").is_file(), "the other recipe was built regardless"
    inject = {k: v for k, v in tree(project).items() if "inject" in k}
    run(project, "plans/small/plan.json")
    assert (project / "prepared/small/manifest.json").is_file()
    assert not list((project / "prepared").glob(".small.*")), "the rerun cleared the killed run's staging"
    assert {k: v for k, v in tree(project).items() if "inject" in k} == inject


@pytest.fixture(scope="module")
def reference(project) -> dict[str, torch.Tensor]:
    """The adapter of an uninterrupted run; its checkpoint is then removed so that each test retrains."""
    run(project, "checkpoints/small")
    weights = adapter(project)
    manifest = read_json(project / "checkpoints/small/manifest.json")
    assert manifest["resumed_from"] is None and manifest["trust_remote_code"] is False
    shutil.rmtree(project / "checkpoints/small")
    return weights


# fault -> (complete trainer checkpoints it leaves, the one the rerun resumes from)
KILLS = {
    "train_step:1": ([], None),  # during the first optimizer step: nothing saved yet
    "train_step:6": (["checkpoint-2", "checkpoint-4"], "checkpoint-4"),  # mid-run: saves every 2 steps
    "publish:checkpoints/small": (["checkpoint-6", "checkpoint-8"], "checkpoint-8"),  # in the final save
}


@pytest.mark.parametrize("fault", KILLS)
def test_killed_training_resumes_to_the_uninterrupted_adapter(project, reference, fault):
    left, resumed = KILLS[fault]
    failing(project, fault, "checkpoints/small")
    assert not (project / "checkpoints/small").exists(), "no half-written checkpoint is published"
    assert trainer_checkpoints(project) == {name: True for name in left}
    run(project, "checkpoints/small")
    manifest = read_json(project / "checkpoints/small/manifest.json")
    assert (manifest["resumed_from"] and Path(manifest["resumed_from"]).name) == resumed
    assert_same_adapter(adapter(project), reference)
    # Only the events and the run's settings for the next run's name (runs/<recipe>/last_run.json) stay.
    assert sorted(path.name for path in (project / "runs/small").iterdir()) == ["last_run.json", "tensorboard"]
    assert not list((project / "checkpoints").glob(".small.*"))
    shutil.rmtree(project / "checkpoints/small")


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(project, reference):
    failing(project, "nan_loss:5", "checkpoints/small")
    log = (project / "logs/small/train.log").read_text()
    assert "recipes/small.yaml: training stopped at optimizer step 5: the loss is NaN or infinite" in log
    assert "checkpoint-4" in log and "Lower train.learning_rate" in log
    assert "Traceback" not in log
    assert trainer_checkpoints(project) == {"checkpoint-2": True, "checkpoint-4": True}
    assert not (project / "checkpoints/small").exists()
    # The poison was in memory only: the kept checkpoint resumes to the uninterrupted result.
    run(project, "checkpoints/small")
    assert Path(read_json(project / "checkpoints/small/manifest.json")["resumed_from"]).name == "checkpoint-4"
    assert_same_adapter(adapter(project), reference)


def test_full_disk_while_saving_fails_clearly_and_keeps_the_previous_checkpoint(project, reference):
    # Size the disk from one real trainer checkpoint: a run killed after its first save.
    shutil.rmtree(project / "checkpoints/small", ignore_errors=True)
    failing(project, "train_step:3", "checkpoints/small")
    saved = next((project / "runs/small").glob("*/checkpoint-2"))
    size = sum(p.stat().st_blocks * 512 for p in saved.rglob("*") if p.is_file())  # tmpfs counts whole pages
    runs = project / "runs"
    shutil.rmtree(runs)
    runs.mkdir()
    # Room for one checkpoint and a half: the second save runs out of space part way.
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", str(runs)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {mount.stderr.strip()}")
    try:
        failing(project, None, "checkpoints/small")
        log = (project / "logs/small/train.log").read_text()
        assert "recipes/small.yaml: " in log and "no space left on the device" in log, log
        assert "Free space and rerun" in log
        assert "Traceback" not in log
        assert trainer_checkpoints(project) == {"checkpoint-2": True, "checkpoint-4": False}
        assert not (project / "checkpoints/small").exists()
        subprocess.run(["mount", "-o", "remount,size=64m", str(runs)], check=True)  # space freed
        run(project, "checkpoints/small")
        assert Path(read_json(project / "checkpoints/small/manifest.json")["resumed_from"]).name == "checkpoint-2"
        assert_same_adapter(adapter(project), reference)
    finally:
        subprocess.run(["umount", str(runs)], check=False)


def test_evaluate_killed_while_publishing_leaves_no_report_and_a_rerun_completes(project):
    failing(project, "publish:reports/small/eval.json", "reports/small/eval.json")
    assert not (project / "reports/small/eval.json").exists()
    assert list((project / "reports/small").glob(".eval.json.partial-*")), "the kill came mid-publish"
    run(project, "reports/small/eval.json")
    assert read_json(project / "reports/small/eval.json")["tuned_loss"] > 0
    assert not list((project / "reports/small").glob(".eval.json.*"))


def test_shell_syntax_in_recipe_paths_and_fields_is_plain_data(project, reference):
    run(project, "reports/inject/eval.json")
    assert_same_adapter(adapter(project, "inject"), reference)
    assert read_json(project / "reports/inject/eval.json") == read_json(project / "reports/small/eval.json")
    assert (project / "canary").is_file()
    assert not [p for p in (project, project.parent, Path.cwd(), Path.home()) for _ in p.glob("PWNED-*")]


# Recipes the workflow must refuse before any job, naming the file and the field; one per kind of check.
REFUSED = {
    "escape": ("model: {path: ../../etc}\ndata: {sources: [{path: data/small/chat.jsonl}]}\n",
               "model.path '../../etc' resolves to", "allowed_paths"),
    "shell": ("model: {path: 'models/tiny-llama; touch PWNED-4'}\ndata: {sources: [{path: data/small/chat.jsonl}]}\n",
              "model.path 'models/tiny-llama; touch PWNED-4' is not a model folder", "point it at"),
    "gpus": (SMALL + "hardware: {accelerator: cuda, gpus: 2}\n", "hardware.accelerator cpu, not 'cuda'",
             "backends that run these settings: trl_local"),
    "..dots": (SMALL, "recipe name '..dots'", "rename the file"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_bad_recipe_stops_the_workflow_before_any_job_touching_nothing(project, name):
    text, field, fix = REFUSED[name]
    before = tree(project, OUTPUT_DIRS + ("logs", "runs"))
    bad = project / "recipes" / f"{name}.yaml"
    bad.write_text(text)
    try:
        result = run(project, check=False)
    finally:
        bad.unlink()
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"recipes/{name}.yaml" in output and field in output and fix in output, output
    assert "Select jobs to execute" not in output
    assert tree(project, OUTPUT_DIRS + ("logs", "runs")) == before


def test_no_planted_token_reaches_any_file_or_the_console(project):
    """Runs last: every stage has run by now with the tokens in its environment."""
    cache = Path(os.environ["XDG_CACHE_HOME"])
    files = [p for root in (project, cache) for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 50
    leaks = [(str(path), name) for path in files for name, token in SECRETS.items()
             if token.encode() in path.read_bytes()]
    assert leaks == []
    assert not [name for name, token in SECRETS.items() if any(token in text for text in CONSOLE)]
