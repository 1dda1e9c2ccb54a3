"""Real `snakemake` on the embedded demo: targets, and reruns of only what an edit makes stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, SNAKEMAKE, copy_workflow, scheduled_jobs, snakemake

from xtrain.train import allocator

pytestmark = pytest.mark.slow

DEMO = (REPO / "recipes" / "demo.yaml").read_text()
# A second, smaller recipe on its own data file, to show that edits stay within one recipe.
SECOND = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/second/chat.jsonl}]
  seq_len: 128
  eval_fraction: 0.2
train: {max_steps: 4, global_batch_size: 4, learning_rate: 5.0e-3}
"""
# What any change to a checkpoint reruns: evaluation, the report and the gate after it.
REPORTING = ("evaluate", "report", "gate")
# The plans: the train job's, and the evaluate job's (plans/<recipe>/evaluate.json), which an edit to eval: redoes.
PLANS = ("plan", "plan_evaluate")
STAGES = ("prepare", *PLANS, "train", *REPORTING)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("workflow"), {"demo": DEMO, "second": SECOND})
    demo_rows = (root / "data/demo/chat.jsonl").read_text().splitlines()
    (root / "data/second").mkdir()
    (root / "data/second/chat.jsonl").write_text("\n".join(demo_rows[:60]) + "\n")
    snakemake(root, "checkpoints/demo", "--cores", "2")
    assert (root / "checkpoints/demo/adapter_model.safetensors").is_file()
    assert not (root / "reports/demo").exists(), "a checkpoint target must not build the report"
    snakemake(root, "--cores", "2")
    return root


def dry_run(root: Path, *targets: str) -> set:
    result = snakemake(root, "-n", *targets)
    return scheduled_jobs(result.stdout + result.stderr)


def jobs(recipe: str, *rules: str) -> set:
    return {(rule, recipe) for rule in rules}


class edited:
    """Replace a file's text for the duration of a block, then restore text and timestamps."""

    def __init__(self, path: Path, change):
        self.path, self.change = path, change

    def __enter__(self):
        self.original, self.stat = self.path.read_text(), self.path.stat()
        self.path.write_text(self.change(self.original))

    def __exit__(self, *exc):
        self.path.write_text(self.original)
        os.utime(self.path, ns=(self.stat.st_atime_ns, self.stat.st_mtime_ns))


def test_complete_build_has_every_target(project):
    for recipe in ("demo", "second"):
        assert (project / f"prepared/{recipe}/manifest.json").is_file()
        assert (project / f"plans/{recipe}/plan.json").is_file()
        assert (project / f"checkpoints/{recipe}/manifest.json").is_file()
        metrics = json.loads((project / f"reports/{recipe}/eval.json").read_text())
        assert metrics["tuned_loss"] < metrics["base_loss"]
        # The train job started again under the allocator this machine offers (TCMalloc, jemalloc or glibc's own).
        train = json.loads((project / f"checkpoints/{recipe}/train_metrics.json").read_text())
        assert train["allocator"] == allocator.for_train_job()
        for stage in ("prepare", "train", "evaluate"):  # each job's measured time and peak memory
            header = (project / f"benchmarks/{recipe}/{stage}.tsv").read_text().splitlines()[0].split("\t")
            assert header[:2] == ["s", "h:m:s"] and "max_rss" in header


# Files that record time and speed: the only outputs two builds of the same inputs may differ in.
TIMED = ("train_metrics.json", "report.html")


def test_a_second_copy_of_the_project_builds_the_same_bytes(project, tmp_path):
    """Identical rebuilds: the smaller recipe built again in a fresh copy of the project gives byte-identical
    outputs (the demo model, prepared data, plan, checkpoint, evaluation, plots) except the files of TIMED."""
    again = copy_workflow(tmp_path, {"second": SECOND})
    (again / "data/second").mkdir()
    shutil.copyfile(project / "data/second/chat.jsonl", again / "data/second/chat.jsonl")
    snakemake(again, "--cores", "2")
    folders = ("models/tiny-llama", "prepared/second", "plans/second", "checkpoints/second", "reports/second")
    files = sorted(path.relative_to(again) for folder in folders for path in (again / folder).rglob("*")
                   if path.is_file() and path.name not in TIMED)
    assert len(files) > 20 and {p.relative_to(project) for folder in folders
                                for p in (project / folder).rglob("*") if p.is_file() and p.name not in TIMED} == set(files)
    differ = [str(path) for path in files if (again / path).read_bytes() != (project / path).read_bytes()]
    assert differ == [], f"differ between two builds: {differ}"


def test_nothing_to_do_after_complete_build(project):
    result = snakemake(project, "-n")
    assert "Nothing to be done" in result.stdout + result.stderr
    assert dry_run(project, "reports/demo/eval.json", "checkpoints/second") == set()


def test_eval_edit_reruns_only_evaluate_its_plan_and_reporting(project):
    with edited(project / "recipes/demo.yaml", lambda t: t.replace("batch_size: 16", "batch_size: 4")):
        assert dry_run(project) == jobs("demo", "plan_evaluate", *REPORTING)


def test_gate_edit_reruns_only_report_and_gate(project):
    with edited(project / "recipes/demo.yaml", lambda t: t.replace("{min: 0}", "{min: -1}")):
        assert dry_run(project) == jobs("demo", "report", "gate")


def test_learning_rate_edit_reruns_train_and_reporting(project):
    with edited(project / "recipes/demo.yaml", lambda t: t.replace("learning_rate: 5.0e-3", "learning_rate: 4.0e-3")):
        assert dry_run(project) == jobs("demo", "train", *REPORTING)


def test_shape_edit_reruns_the_plan_too(project):
    with edited(project / "recipes/demo.yaml", lambda t: t.replace("epochs: 3", "epochs: 2")):
        assert dry_run(project) == jobs("demo", *PLANS, "train", *REPORTING)


def test_data_change_reruns_every_stage_of_that_recipe_only(project):
    extra = '{"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}\n'
    with edited(project / "data/demo/chat.jsonl", lambda t: t + extra):
        assert dry_run(project) == jobs("demo", *STAGES)


def test_new_recipe_adds_only_its_jobs(project):
    third = project / "recipes/third.yaml"
    third.write_text(SECOND)
    try:
        assert dry_run(project) == jobs("third", *STAGES)
    finally:
        third.unlink()


def test_bad_recipe_fails_before_any_job_naming_file_and_field(project):
    bad = project / "recipes/broken.yaml"
    bad.write_text(SECOND.replace("max_steps: 4", "max_step: 4"))
    try:
        result = snakemake(project, "--cores", "2", check=False)
    finally:
        bad.unlink()
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "recipes/broken.yaml" in output and "train.max_step" in output
    assert "Select jobs to execute" not in output


def test_a_target_naming_other_recipes_runs_beside_a_bad_one_named_in_one_warning_line(project):
    bad = project / "recipes/broken.yaml"
    bad.write_text(SECOND.replace("max_steps: 4", "max_step: 4"))
    try:
        result = snakemake(project, "-n", "reports/second/gate.json")
    finally:
        bad.unlink()
    named = [line for line in (result.stdout + result.stderr).splitlines() if "broken" in line]
    assert named == ["recipes/broken.yaml: invalid recipe: train.max_step: unknown field; did you mean `max_steps`? "
                     "(set aside: a target that needs `broken` stops on this, others run)"]


def test_unknown_recipe_target_is_named(project):
    result = snakemake(project, "-n", "checkpoints/nosuch", check=False)
    assert result.returncode != 0
    assert "recipes/nosuch.yaml" in result.stdout + result.stderr


def test_lint_is_clean(project):
    result = snakemake(project, "--lint")
    assert "Congratulations" in result.stdout + result.stderr, result.stdout + result.stderr
    formatted = subprocess.run([str(Path(SNAKEMAKE).with_name("snakefmt")), "--check", "."], cwd=REPO,
                               capture_output=True, text=True)
    assert formatted.returncode == 0, f"run `snakefmt .`:\n{formatted.stderr}"


def test_real_rerun_after_learning_rate_edit_touches_only_train_and_reporting(project):
    """Runs last in this module: it really retrains demo, then leaves a consistent build behind."""
    untouched = [project / "prepared/demo/manifest.json", project / "plans/demo/plan.json",
                 project / "plans/demo/evaluate.json", project / "reports/second/eval.json"]
    before = {path: path.stat().st_mtime_ns for path in untouched}
    old_metrics = json.loads((project / "reports/demo/eval.json").read_text())
    recipe = project / "recipes/demo.yaml"
    recipe.write_text(recipe.read_text().replace("learning_rate: 5.0e-3", "learning_rate: 2.0e-3"))
    result = snakemake(project, "--cores", "2")
    assert scheduled_jobs(result.stdout + result.stderr) == jobs("demo", "train", *REPORTING)
    summary = result.stderr[result.stderr.index("xtrain: what this run built"):].splitlines()
    assert summary[1] == "demo"
    rows = dict(line.strip().split("  ", 1) for line in summary[2:] if line.startswith("  "))
    assert {label: text.strip() for label, text in rows.items() if label in ("built", "report")} == {
        "built": "train, evaluate, report, gate", "report": "reports/demo/report.html"}
    assert "held out, base -> tuned" in rows["loss"] and rows["gate"].strip().startswith("passes: loss_improvement")
    assert {path: path.stat().st_mtime_ns for path in untouched} == before
    new_metrics = json.loads((project / "reports/demo/eval.json").read_text())
    assert new_metrics["base_loss"] == pytest.approx(old_metrics["base_loss"], rel=1e-6)
    assert new_metrics["tuned_loss"] != old_metrics["tuned_loss"]
    assert dry_run(project) == set()
