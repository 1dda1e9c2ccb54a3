"""Shared test helpers: the repo root, a tiny model built once, and a Snakemake runner."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Under `pytest -n 3` (make test) three workers share the two cores: one thread each, or OpenMP's spinning
# threads oversubscribe the machine. Set before anything imports torch; snakemake jobs inherit it. Jobs still take
# their rule's threads (run_stage), so their OpenMP threads wait passively, not spinning on cores another worker
# needs: test_train, test_preference and test_report under -n 3 took 142-143 s instead of 151-162 s, 12% less CPU
# (BENCHMARKS.md, "CI's time").
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import yaml  # noqa: E402

from xtrain.data import prepare  # noqa: E402
from xtrain.evaluate import evaluate  # noqa: E402
from xtrain.plan import Plan, make_plan, write_plan  # noqa: E402
from xtrain.recipe import DATA_KINDS, Data, DataSource, Eval, Hardware, Train  # noqa: E402
from xtrain.train.run import run_training  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The backends' environments are built in the machine's environment store (xtrain.project.envs), once per lock for
# every clone: a CI run in a fresh clone reuses the builds of the last one, and builds a changed lock anew.
os.environ.setdefault("XTRAIN_ENV_STORE", str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                              / "xtrain" / "venvs"))
# Other caches (the plan's CPU probe, Hugging Face's) go to a fresh folder: tests neither read nor leave them in
# ~/.cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="xtrain-tests-cache-")
# Snakemake's Slurm executor plugin runs `scontrol show config` each time snakemake starts (for a help text). Where
# Slurm's client is installed and no controller answers (here, outside test_slurm's cluster), scontrol retries for
# the configuration's MessageTimeout, 10 s by default, and with no configuration it looks the controller up in DNS
# for longer: every snakemake call of the suite paid 9 s (`snakemake --version`: 10.3 s, 1.9 s with this). The tests'
# Slurm clients read a configuration naming no live controller, given up on at once; test_slurm's cluster unsets
# SLURM_CONF in its process while it runs (tests/slurm_cluster.py).
NO_CLUSTER = Path(tempfile.mkdtemp(prefix="xtrain-tests-slurm-")) / "slurm.conf"
NO_CLUSTER.write_text("ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort=9\nMessageTimeout=1\n")
os.environ.setdefault("SLURM_CONF", str(NO_CLUSTER))
# A fixed CPU probe (xtrain.plan.probe): no plan in the tests depends on this machine's speed or load.
os.environ["XTRAIN_CPU_PROBE"] = "1.2e11,2.0e-6"
# A fixed CPU matmul peak (xtrain.plan.peak): the train job's MFU is taken over it, not over a measurement here.
os.environ["XTRAIN_CPU_PEAK"] = "2.4e11"
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# What a workflow copy needs: the workflow, the library, and the embedded demo inputs.
WORKFLOW_PATHS = ("Snakefile", "rules", "config", "envs", "scripts", "src", "profiles", "data/demo", "data/pref",
                  "data/tiny-llama")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The embedded demo model, built as rule build_tiny_model builds it."""
    from xtrain.models.tiny import build_tiny_model

    settings = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["tiny_model"]
    out = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_model(REPO / settings["corpus"], out, **settings["settings"])
    return out


# A complete plan.json (the demo model's, trl_cpu on the CPU) for tests of what backends do with a plan.
SAMPLE_PLAN = {
    "model": {"total": 332256, "trainable": 21504, "largest_layer": 116928, "layers": 2, "hidden_size": 96,
              "intermediate_size": 272, "vocab_size": 1024},
    "data": {"train_rows": 352, "train_tokens": 11801, "supervised_tokens": 3139, "seq_len": 128,
             "longest_sequence_tokens": 76, "mean_sequence_tokens": 33.5, "fingerprint": "0" * 64},
    "layout": {"strategy": "single", "devices": 1, "nodes": 1, "global_batch_size": 8, "micro_batch_size": 8,
               "gradient_accumulation_steps": 1},
    "precision": "fp32", "weights_dtype": "fp32", "gradient_checkpointing": False,
    "compile": {"speedup": 0.92, "warmup_seconds": 0.0, "batch_shapes": 2,
                "reason": "eager: a compiled step on cpu in fp32 measured 0.92x: slower than eager"},
    "memory": {"estimator": "traced", "device": "cpu", "peak_bytes_per_device": 18666280,
               "reserved_bytes_per_device": 18666280, "budget_bytes_per_device": 21137969971,
               "breakdown_bytes": {"weights": 1329120, "gradients": 0, "optimizer": 172096, "activations": 12184328,
                                   "workspace": 4980736},
               "analytical_peak_bytes_per_device": 18770201},
    "time": {"steps": 44, "tokens_per_step": 268, "flops_per_token": 1324032, "flops_source": "traced",
             "ops_per_micro_step": 2058, "device_flops": 1.35e11, "op_seconds": 1.48e-05,
             "throughput_source": "cpu probe (2 threads, fp32, width 96) x efficiency 0.75",
             "seconds_per_step": 0.0331, "seconds": 1.5},
    "resources": {"gpus": 0, "nodes": 1, "cpus": 2, "mem_mb": 1943, "runtime": 11,
                  "allocator": "glibc"},
}


def sample_plan(**changes) -> Plan:
    """SAMPLE_PLAN with `changes`: top-level values, or a section's fields as a dict merged into that section."""
    data = {key: ({**value, **changes[key]} if isinstance(value, dict) and key in changes else changes.get(key, value))
            for key, value in SAMPLE_PLAN.items()}
    return Plan.model_validate(data)


def supervised_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive supervised tokens of a prepared row, in order."""
    runs, current = [], []
    for token, keep in zip(ids, mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs, current = runs + [current], []
    return runs + ([current] if current else [])


@pytest.fixture(scope="session")
def prepared(tiny_model, tmp_path_factory) -> Path:
    """The demo data prepared for the demo model at seq_len 128 (as build_run prepares it)."""
    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    out = tmp_path_factory.mktemp("demo-prepared") / "prepared"
    prepare([Path(data.sources[0].path)], tiny_model, data, out)
    return out


def build_run(tmp_path: Path, model_dir: Path, train: Train, hardware: Hardware | None = None,
              source: Path = REPO / "data/demo/chat.jsonl") -> dict[str, Path]:
    """prepare -> plan -> train -> evaluate through the library, on the demo data (or `source`, of the kind
    train.objective trains on) at seq_len 128."""
    data = Data(sources=[DataSource(path=str(source))], seq_len=128, eval_fraction=0.1)
    hardware = hardware or Hardware()
    prepared = tmp_path / "prepared"
    manifest = prepare([Path(s.path) for s in data.sources], model_dir, data, prepared,
                       kind=DATA_KINDS[train.objective])
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, make_plan(model_dir, manifest, train, hardware))
    checkpoint = tmp_path / "checkpoint"
    run_training(
        model_dir=model_dir, prepared_dir=prepared, plan_path=plan_path, train=train, hardware=hardware,
        out=checkpoint, work_dir=tmp_path / "runs",
    )
    report = tmp_path / "eval.json"
    evaluate(model_dir, checkpoint, prepared, Eval(batch_size=5), report)
    return {"prepared": prepared, "plan": plan_path, "checkpoint": checkpoint, "report": report,
            "runs": tmp_path / "runs"}


def copy_workflow(dest: Path, recipes: dict[str, str]) -> Path:
    """A runnable copy of the project in `dest` with the given recipes (name -> YAML text)."""
    for rel in WORKFLOW_PATHS:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "recipes").mkdir()
    for name, text in recipes.items():
        (dest / "recipes" / f"{name}.yaml").write_text(text)
    return dest


# The time limit of a test's subprocess: only against a hang, far above what any run takes on a loaded machine
# (a CPU hog on both cores makes the suite ~2.5x slower, BENCHMARKS.md); no test asserts on speed.
HANG_SECONDS = 1800


def snakemake(
    cwd: Path, *args: str, check: bool = True, timeout: int = HANG_SECONDS, env: dict | None = None,
    program: tuple[str, ...] = (SNAKEMAKE,),
) -> subprocess.CompletedProcess:
    """Run `program` (Snakemake's command line) in `cwd`; `check`: fail the test, with its output, if it fails."""
    result = subprocess.run(
        [*program, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


JOB = re.compile(r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    wildcards: recipe=([\w-]+)", re.MULTILINE)
RULE = re.compile(r"^(?:local)?rule (\w+):$", re.MULTILINE)


def scheduled_jobs(output: str) -> set[tuple[str, str | None]]:
    """(rule, recipe) of every job Snakemake printed, leaving out the aggregate `all`."""
    with_recipe = set(JOB.findall(output))
    rules_with_recipe = {rule for rule, _ in with_recipe}
    others = {(rule, None) for rule in RULE.findall(output) if rule not in rules_with_recipe and rule != "all"}
    return with_recipe | others


# Files whose tests take minutes, longest first (seconds: their tests among the slowest 40 of one run of
# `make test` here, 2026-12-06, load 2-4). `make test` hands whole files to its workers in collection order
# (--dist loadfile --no-loadscope-reorder): these go first, and the short files fill in behind them. xdist's own
# order, by number of tests, started the Slurm file (3 tests, one cluster, so one worker) among the last.
LONG_FILES = (
    "test_gpu_recipes.py",  # 1,155
    "test_slurm.py",  # 815 (before the polling, freezing and shared-chain changes of 2026-12-06)
    "test_smoke.py",  # 253
    "test_dvc.py",  # 194
    "test_workflow.py",  # 182
    "test_robustness.py",  # 168
    "test_chain.py",  # 136
    "test_preference.py",  # 105
    "test_export.py",  # 100
    "test_report.py",  # 92
    "test_backend_axolotl.py",  # 75
    "test_train.py",  # 64
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of LONG_FILES first, in its order; every file's tests stay together and in their order."""
    rank = {name: index for index, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))
