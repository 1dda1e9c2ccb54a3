"""The demo through a real Slurm cluster (one node on this machine): sbatch, squeue, scontrol."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, SNAKEMAKE, copy_workflow, snakemake
from slurm_cluster import Cluster, show_jobs

pytestmark = pytest.mark.slow

# Without slurmdbd, sacct never answers: poll with squeue instead, and skip the account lookup.
NO_ACCOUNTING = ("--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2",
                 "--slurm-no-account")


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


def test_demo_checkpoint_through_sbatch_asks_for_what_the_plan_says(cluster, tmp_path):
    root = copy_workflow(tmp_path, {"demo": (REPO / "recipes/demo.yaml").read_text()})
    snakemake(root, "--profile", "profiles/slurm", "checkpoints/demo", *NO_ACCOUNTING,
              env={"XTRAIN_SLURM_PARTITION": "xtrain"})
    assert (root / "checkpoints/demo/adapter_model.safetensors").is_file()

    plan = json.loads((root / "plans/demo/plan.json").read_text())["resources"]
    jobs = {job["Comment"].split("_wildcards")[0]: job for job in show_jobs() if job["Comment"].startswith("rule_")}
    assert {"rule_prepare", "rule_train"} <= set(jobs) and "rule_plan" not in jobs, "plan is a local rule"
    train = jobs["rule_train"]
    assert train["JobState"] == "COMPLETED"
    assert train["Partition"] == "xtrain", "XTRAIN_SLURM_PARTITION chooses the partition without editing the profile"
    hours, minutes = divmod(plan["runtime"], 60)
    assert train["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00"
    assert train["MinMemoryNode"] == f"{plan['mem_mb']}M"
    assert train["NumNodes"] == str(plan["nodes"])
    assert train["NumCPUs"] == str(plan["cpus"])
    assert "gres/gpu" not in train.get("TRES", ""), "a CPU plan asks for no GPU"


# A few hundred steps with a resumable trainer checkpoint every 6 s, so a kill costs little work.
LONG = """
model: {path: models/tiny-llama}
data:
  sources: [{path: data/demo/chat.jsonl}]
  seq_len: 128
train: {max_steps: 600, global_batch_size: 16, learning_rate: 1.0e-3, logging_steps: 50, checkpoint_minutes: 0.1}
"""


def latest_checkpoint_step(root: Path) -> int:
    return max((int(p.name.split("-")[1]) for p in root.glob("runs/long/*/checkpoint-*")), default=0)


def test_time_limit_is_reported_and_the_rerun_resumes_from_the_last_trainer_checkpoint(cluster, tmp_path):
    root = copy_workflow(tmp_path, {"long": LONG})
    command = [SNAKEMAKE, "--profile", "profiles/slurm", "checkpoints/long", *NO_ACCOUNTING]
    first = subprocess.Popen(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Once two thirds of the run are saved, cut its time limit to one minute: Slurm kills it for
    # TIMEOUT at its next check (whatever this machine's speed), and the rerun has little left to do.
    deadline = time.time() + 400
    while latest_checkpoint_step(root) < 400:
        assert first.poll() is None and time.time() < deadline, "training ended before its time limit was cut"
        time.sleep(1)
    train = next(job for job in show_jobs() if job["Comment"] == "rule_train_wildcards_long")
    subprocess.run(["scontrol", "update", f"JobId={train['JobId']}", "TimeLimit=1"], check=True)
    output, _ = first.communicate(timeout=300)

    assert first.returncode != 0
    assert next(job for job in show_jobs() if job["JobId"] == train["JobId"])["JobState"] == "TIMEOUT"
    assert "TIMEOUT" in output, "Snakemake's report names the cause"
    assert not (root / "checkpoints/long").exists(), "no half-written checkpoint"
    saved = latest_checkpoint_step(root)
    assert saved >= 400

    snakemake(root, *command[1:])
    manifest = json.loads((root / "checkpoints/long/manifest.json").read_text())
    assert manifest["resumed_from"].endswith(f"checkpoint-{saved}")
    assert "resuming an interrupted run" in (root / "logs/long/train.log").read_text()
    assert json.loads((root / "checkpoints/long/train_metrics.json").read_text())["steps"] == 600
    assert not list((root / "checkpoints").glob(".long.partial-*"))
