"""Recipes through a real Slurm cluster (one node on this machine): sbatch, squeue, scontrol."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import HANG_SECONDS, copy_workflow, snakemake
from slurm_cluster import Cluster, show_jobs

from xtrain.plan import read_plan
from xtrain.train.run import LOCK_FILE
from xtrain_backend_side.trainer_parts import COMPLETE_MARKER

pytestmark = pytest.mark.slow

# Without slurmdbd, sacct never answers: poll with squeue instead, and skip the account lookup.
NO_ACCOUNTING = ("--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
                 "--slurm-no-account")
# Snakemake whose Slurm executor checks its jobs every 2 s instead of backing off by 10 s a check
# (tests/slurm_snakemake.py): it notices a job's end within seconds, not a minute or more later.
SNAKEMAKE_POLLING = (sys.executable, str(Path(__file__).with_name("slurm_snakemake.py")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs the Slurm test as root; this run is not root")
        pytest.skip("starting Slurm daemons needs root")
    cluster = Cluster(tmp_path_factory.mktemp("slurm-state"))
    cluster.start()
    yield cluster
    cluster.stop()


# The run is frozen once it has a trainer checkpoint, so it outlasts its limit on any machine: max_steps need only
# be more than the trainer can do between its first checkpoint (a quarter of the steps, or 6 s, whichever comes
# first) and being frozen (the test looks every 0.2 s), and the rerun trains the rest (~170 steps, ~6 s idle).
MAX_STEPS = 240
LONG = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/chat.jsonl}]
  seq_len: 128
train: {max_steps: %d, global_batch_size: 16, learning_rate: 1.0e-3, logging_steps: 60, checkpoint_minutes: 0.1}
""" % MAX_STEPS


def latest_checkpoint_step(root: Path) -> int:
    """The newest completely saved trainer checkpoint (the one a rerun resumes from), 0 when none is."""
    return max((int(p.parent.name.split("-")[1]) for p in root.glob(f"runs/long/*/checkpoint-*/{COMPLETE_MARKER}")),
               default=0)


def run_until_a_checkpoint_then_time_out(root: Path, command: tuple[str, ...]) -> tuple[int, str]:
    """Start the run with an hour's limit, and once a trainer checkpoint is complete freeze the trainer (SIGSTOP to
    the PID its run folder's lock names) and cut the job's limit to one minute: Slurm kills the job for TIMEOUT
    with something to resume from, however slow or fast the machine is. (A one-minute limit from the start kills a
    start slowed by a CPU hog before any checkpoint; a trainer left running must have thousands of steps to outlast
    the minute on an idle machine, and the rerun retrains most of them. Frozen, it also leaves the CPU to others.)"""
    log = root / "snakemake-killed.log"
    frozen = None
    with log.open("w") as output:
        process = subprocess.Popen([*SNAKEMAKE_POLLING, *command, "--set-resources", "train:runtime=60"], cwd=root,
                                   stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + HANG_SECONDS
            while latest_checkpoint_step(root) == 0:
                assert process.poll() is None, f"the run ended before its first checkpoint:\n{log.read_text()}"
                assert time.monotonic() < deadline, "no trainer checkpoint within HANG_SECONDS"
                time.sleep(0.2)
            frozen = int((root / "runs/long" / LOCK_FILE).read_text())
            os.kill(frozen, signal.SIGSTOP)
            train = next(job for job in show_jobs() if job["Comment"] == "rule_train_wildcards_long")
            subprocess.run(["scontrol", "update", f"JobId={train['JobId']}", "TimeLimit=1"], check=True)
            returncode = process.wait(timeout=HANG_SECONDS)
        finally:
            if process.poll() is None:  # the test failed before Slurm ended the run: end it and the frozen trainer
                process.kill()
                if frozen is not None:
                    os.kill(frozen, signal.SIGKILL)
    return returncode, log.read_text()


def test_time_limit_is_reported_and_the_rerun_resumes_from_the_last_trainer_checkpoint(cluster, tmp_path):
    root = copy_workflow(tmp_path, {"long": LONG})
    # Data and plan built here: this test is about the train job (the chain below sends prepare through Slurm).
    snakemake(root, "--cores", "2", "plans/long/plan.json")
    command = ("--profile", "profiles/slurm", "checkpoints/long", *NO_ACCOUNTING)
    returncode, output = run_until_a_checkpoint_then_time_out(root, command)

    assert returncode != 0, "the run was meant to outlast its one-minute limit"
    train = next(job for job in show_jobs() if job["Comment"] == "rule_train_wildcards_long")
    assert train["JobState"] == "TIMEOUT"
    assert train["Partition"] == "debug", "XTRAIN_SLURM_PARTITION unset: the cluster's default partition"
    assert "TIMEOUT" in output, "Snakemake's report names the cause"
    assert not (root / "checkpoints/long").exists(), "no half-written checkpoint"
    saved = latest_checkpoint_step(root)
    assert 0 < saved < MAX_STEPS

    # The rerun asks for an hour: the plan's limit (1.5 x its prediction + 10 min) is for this machine quiet, and
    # beside a CPU hog the remaining steps could outlast it. The test is about resuming.
    snakemake(root, *command, "--set-resources", "train:runtime=60", program=SNAKEMAKE_POLLING)
    manifest = json.loads((root / "checkpoints/long/manifest.json").read_text())
    assert manifest["resumed_from"].endswith(f"checkpoint-{saved}")
    assert "resuming an interrupted run" in (root / "logs/long/train.log").read_text()
    assert json.loads((root / "checkpoints/long/train_metrics.json").read_text())["steps"] == MAX_STEPS
    assert not list((root / "checkpoints").glob(".long.partial-*"))


# Two cheap stages of a chain (model.recipe): LoRA SFT on the tiny model, then DPO on its adapter merged by rule
# merge_base. Names of their own: the module's cluster remembers the other tests' jobs.
CHAIN_SFT = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/chat.jsonl, format: messages}]
  seq_len: 128
train: {max_steps: 3, global_batch_size: 4, learning_rate: 5.0e-3, lora: {r: 8, alpha: 16, dropout: 0.0}}
"""
CHAIN_DPO = """
model: {recipe: chain_sft}
data:
  sources: [{path: data/pref/colours_sums.jsonl}]
  seq_len: 128
train: {objective: dpo, max_steps: 2, global_batch_size: 4, learning_rate: 5.0e-3, logging_steps: 1}
"""


def slurm_time(job: dict[str, str], field: str) -> datetime:
    return datetime.fromisoformat(job[field])


@pytest.fixture(scope="module")
def chain_build(cluster, tmp_path_factory) -> tuple[Path, dict[str, dict[str, str]]]:
    """The chain built through Slurm once, in the partition XTRAIN_SLURM_PARTITION names: the project and its jobs
    (as `scontrol show job` gives them) by rule and recipe."""
    root = copy_workflow(tmp_path_factory.mktemp("chain"), {"chain_sft": CHAIN_SFT, "chain_dpo": CHAIN_DPO})
    snakemake(root, "--profile", "profiles/slurm", "checkpoints/chain_dpo", *NO_ACCOUNTING,
              env={"XTRAIN_SLURM_PARTITION": "xtrain"}, program=SNAKEMAKE_POLLING)
    jobs = [job for job in show_jobs() if job.get("WorkDir") == str(root) and job["Comment"].startswith("rule_")]
    by_rule = {job["Comment"]: job for job in jobs}
    assert len(by_rule) == len(jobs), "each job of the chain ran once"
    return root, by_rule


def test_a_checkpoint_through_sbatch_asks_for_what_the_plan_says(chain_build):
    root, jobs = chain_build
    assert (root / "checkpoints/chain_sft/adapter_model.safetensors").is_file()

    plan = read_plan(root / "plans/chain_sft/plan.json").resources
    rules = {comment.split("_wildcards")[0] for comment in jobs}
    assert {"rule_prepare", "rule_train"} <= rules and "rule_plan" not in rules, "plan is a local rule"
    train = jobs["rule_train_wildcards_chain_sft"]
    assert train["JobState"] == "COMPLETED"
    assert {job["Partition"] for job in jobs.values()} == {"xtrain"}, \
        "XTRAIN_SLURM_PARTITION chooses the partition without editing the profile"
    hours, minutes = divmod(plan.runtime, 60)
    assert train["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00"
    assert train["MinMemoryNode"] == f"{plan.mem_mb}M"
    assert train["NumNodes"] == str(plan.nodes)
    assert train["NumCPUs"] == str(plan.cpus)
    assert "gres/gpu" not in train.get("TRES", ""), "a CPU plan asks for no GPU"


def test_a_chain_runs_as_dependent_jobs_each_submitted_after_its_upstream_ended(chain_build):
    """Snakemake submits a job once its inputs exist: the upstream's train job has ended before merge_base is
    submitted, and merge_base before any job of the downstream recipe (whose model is bases/chain_sft)."""
    root, by_rule = chain_build
    assert all(job["JobState"] == "COMPLETED" for job in by_rule.values()), \
        [(comment, job["JobState"]) for comment, job in by_rule.items()]
    assert sorted(by_rule) == ["rule_merge_base_wildcards_chain_sft", "rule_prepare_wildcards_chain_dpo",
                               "rule_prepare_wildcards_chain_sft", "rule_train_wildcards_chain_dpo",
                               "rule_train_wildcards_chain_sft"], "plan is a local rule"
    upstream_train, merge = by_rule["rule_train_wildcards_chain_sft"], by_rule["rule_merge_base_wildcards_chain_sft"]
    downstream = [by_rule["rule_prepare_wildcards_chain_dpo"], by_rule["rule_train_wildcards_chain_dpo"]]
    assert slurm_time(upstream_train, "EndTime") <= slurm_time(merge, "SubmitTime")
    for job in downstream:
        assert slurm_time(merge, "EndTime") <= slurm_time(job, "SubmitTime"), job["Comment"]
    manifest = json.loads((root / "checkpoints/chain_dpo/manifest.json").read_text())
    assert [stage["recipe"] for stage in manifest["lineage"]] == ["chain_sft", "chain_dpo"]
    assert manifest["lineage"][1]["base_model"] == "bases/chain_sft"
