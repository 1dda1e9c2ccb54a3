"""The demo through a real Slurm cluster (one node on this machine): sbatch, squeue, scontrol."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO, copy_workflow, snakemake
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
    assert {"rule_prepare", "rule_plan", "rule_train"} <= set(jobs), jobs.keys()
    train = jobs["rule_train"]
    assert train["JobState"] == "COMPLETED"
    assert train["Partition"] == "xtrain", "XTRAIN_SLURM_PARTITION chooses the partition without editing the profile"
    hours, minutes = divmod(plan["runtime"], 60)
    assert train["TimeLimit"] == f"{hours:02d}:{minutes:02d}:00"
    assert train["MinMemoryNode"] == f"{plan['mem_mb']}M"
    assert train["NumNodes"] == str(plan["nodes"])
    assert "gres/gpu" not in train.get("TRES", ""), "a CPU plan asks for no GPU"
