"""Shared by the tests of the backends with their own environment: the tiny recipe they all train, its trl_cpu
reference run (once per session), and the backend environments, built once into the work tree's .venvs/<backend>/
(as rule build_backend_env builds them) and reused while their ready.json records the current spec's hash."""

from __future__ import annotations

import fcntl
import math

import pytest
import yaml
from checkpoint_contract import assert_checkpoint_contract
from conftest import REPO, build_run

from xtrain.artifacts import read_json
from xtrain.data import prepare
from xtrain.plan import make_plan, write_plan
from xtrain.project.envs import build, is_built
from xtrain.recipe import Data, DataSource, Hardware, Train
from xtrain.train.backends.registry import REGISTRY
from xtrain.train.run import run_training
from xtrain_backend_side.rewards import needed_columns

# A few steps of LoRA on the demo data, one logged loss per step.
TINY = {"method": "lora", "global_batch_size": 4, "max_steps": 4, "learning_rate": 5e-3, "logging_steps": 1}
# Two DPO steps of LoRA on the demo pairs. No LoRA dropout: the other environments' preference trainers turn it off.
PAIRS = REPO / "data/pref/colours_sums.jsonl"
TINY_DPO = {**TINY, "objective": "dpo", "max_steps": 2, "lora": {"dropout": 0.0}}


def tiny_train(backend: str, **changes) -> Train:
    return Train(**{**TINY, "backend": backend, **changes})


@pytest.fixture(scope="session")
def trl_cpu_reference(tiny_model, tmp_path_factory) -> dict:
    """train_metrics.json of trl_cpu on the tiny recipe: what each backend's first-step loss is compared with."""
    run = build_run(tmp_path_factory.mktemp("trl_cpu_reference"), tiny_model, tiny_train("trl_cpu"))
    return read_json(run["checkpoint"] / "train_metrics.json")


def tiny_dpo(backend: str, **changes) -> Train:
    return Train(**{**TINY_DPO, "backend": backend, **changes})


def dpo_run(backend: str, tiny_model, folder) -> tuple[dict, list[dict]]:
    """The tiny DPO recipe through the train stage on `backend`: (the run's paths, the trainer's log history, which
    holds the DPO metrics that train_metrics.json does not)."""
    results = []
    run = REGISTRY[backend].run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(REGISTRY[backend], "run", lambda job: results.append(run(job)) or results[-1])
        # fp32 on every backend, whatever this CPU offers (the log-probs are compared to trl_cpu's at 1e-4).
        patch.setattr("xtrain.plan.planner.cpu_supports_bf16", lambda: False)
        paths = build_run(folder, tiny_model, tiny_dpo(backend), source=PAIRS)
    return paths, results[0].log_history


@pytest.fixture(scope="session")
def trl_cpu_dpo_reference(tiny_model, tmp_path_factory) -> dict:
    """The first logged step of trl_cpu on the tiny DPO recipe (loss, rewards, log-probs of the batch's answers)."""
    _, history = dpo_run("trl_cpu", tiny_model, tmp_path_factory.mktemp("trl_cpu_dpo_reference"))
    return next(entry for entry in history if "loss" in entry)


# Two GRPO steps of LoRA: 2 prompts x 4 completions of at most 8 tokens, scored by a built-in reward and the
# project's own, which reads each row's `answer`.
PROMPTS = REPO / "data/demo/prompts.jsonl"
TINY_GRPO = {**TINY, "objective": "grpo", "max_steps": 2, "global_batch_size": 8,
             "rl": {"generations": 4, "max_completion_length": 8, "kl_weight": 0.05},
             "rewards": [{"type": "format", "pattern": r"^\s*[A-Z]"},
                         {"type": "python", "file": "rewards/words.py", "function": "short", "weight": 0.5}]}
WORDS = """def short(completions, answer, **kwargs):
    assert all(isinstance(text, str) and text for text in answer), answer
    return [-len(completion.split()) / 10 for completion in completions]
"""


def tiny_grpo(backend: str, **changes) -> Train:
    return Train(**{**TINY_GRPO, "backend": backend, **changes})


def grpo_run(backend: str, tiny_model, tmp_path, monkeypatch) -> dict:
    """Two GRPO steps of the tiny recipe on `backend`, from a project of its own (its rewards/ folder; .venvs/ linked
    to the work tree's): the checkpoint contract, and each step's reward in train_metrics.json as the weighted sum of
    the two rewards' means, with the KL, completion lengths and tokens. Returns train_metrics.json."""
    project = tmp_path / "project"
    (project / "rewards").mkdir(parents=True)
    (project / "rewards/words.py").write_text(WORDS)
    (project / ".venvs").symlink_to(REPO / ".venvs")
    monkeypatch.chdir(project)  # rewards/ and .venvs/ are found from the train job's working folder
    train = tiny_grpo(backend)
    data = Data(sources=[DataSource(path=str(PROMPTS))], seq_len=128, eval_fraction=0.1)
    settings = {"max_completion_length": train.rl.max_completion_length,
                "reward_columns": needed_columns(reward.model_dump() for reward in train.rewards)}
    manifest = prepare([PROMPTS], tiny_model, data, tmp_path / "prepared", kind="prompts", prompt_settings=settings)
    write_plan(tmp_path / "plan.json", make_plan(tiny_model, manifest, train, Hardware()))
    checkpoint = tmp_path / "checkpoint"
    run_training(model_dir=tiny_model, prepared_dir=tmp_path / "prepared", plan_path=tmp_path / "plan.json",
                 train=train, hardware=Hardware(), out=checkpoint, work_dir=tmp_path / "runs")
    metrics = assert_checkpoint_contract(checkpoint, tiny_model, backend)
    assert (checkpoint / "adapter_model.safetensors").is_file()
    steps = metrics["rl"]
    assert metrics["steps"] == 2 and [step["step"] for step in steps] == [1, 2]
    assert_each_step_rewarded(steps)
    # Tokens are the prompts' and the completions' the trainer counted: 8 completions a step, after their prompts.
    completions = sum(step["completions/mean_length"] * 8 for step in steps)
    assert completions < metrics["tokens_seen"] <= completions + 16 * manifest["splits"]["train"]["max_len"]
    return metrics


@pytest.fixture(scope="session")
def trl_cpu_grpo_reference(tiny_model, tmp_path_factory) -> dict:
    """train_metrics.json of trl_cpu on the tiny GRPO recipe."""
    with pytest.MonkeyPatch.context() as patch:
        return grpo_run("trl_cpu", tiny_model, tmp_path_factory.mktemp("trl_cpu_grpo_reference"), patch)


def train_tiny_grpo_with_backend(backend: str, reference: dict, tiny_model, tmp_path, monkeypatch) -> dict:
    """`grpo_run` in the backend's own environment, whose first step must score as trl_cpu's: the same seed samples
    the same prompts and completions from the same model, which the same rewards score (the policy moves only from
    step 1's update on)."""
    ensure_backend_env(backend)
    metrics = grpo_run(backend, tiny_model, tmp_path, monkeypatch)
    first, expected = metrics["rl"][0], reference["rl"][0]
    for key in ("reward", "rewards/format/mean", "rewards/rewards/words.py:short/mean", "completions/mean_length"):
        assert first[key] == pytest.approx(expected[key], abs=1e-6), f"step 1 {key}: {first[key]} vs {expected[key]}"
    return metrics


def ensure_backend_env(backend: str) -> None:
    """Build .venvs/<backend> unless it is a build of the current spec; one builder at a time (xdist workers)."""
    spec, target = REPO / "envs" / f"{backend}.yaml", REPO / ".venvs" / backend
    target.parent.mkdir(exist_ok=True)
    with open(target.parent / f".{backend}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built(spec, target):
            backends = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["backends"]
            build(spec, target, backends[backend].get("uninstall", []))


def train_tiny_recipe_with_backend(backend: str, reference: dict, tiny_model, tmp_path, monkeypatch) -> dict:
    """Train the tiny LoRA recipe in the backend's own environment and check what every such backend promises: the
    checkpoint contract, four logged steps, trl_cpu's first-step loss within 2% (the same rows in the first
    batch and LoRA's B at zero make it the base model's loss on that batch) and a tuned model better than
    the base. Returns the checkpoint's train_metrics.json."""
    ensure_backend_env(backend)
    monkeypatch.chdir(REPO)  # the backend finds its interpreter under .venvs/
    run = build_run(tmp_path, tiny_model, tiny_train(backend))
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, backend)
    assert (run["checkpoint"] / "adapter_model.safetensors").is_file()
    assert metrics["steps"] == 4 and [entry["step"] for entry in metrics["loss"]] == [1, 2, 3, 4]
    first, expected = metrics["loss"][0]["loss"], reference["loss"][0]["loss"]
    assert first == pytest.approx(expected, rel=0.02), f"first-step loss {first} vs trl_cpu {expected}"
    report = read_json(run["report"])
    assert report["tuned_loss"] < report["base_loss"]
    # The default train.report_to through the backend's own TensorBoard integration.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (run["runs"] / "tensorboard").iterdir()
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2, 3, 4]
    return metrics


def train_tiny_dpo_with_backend(backend: str, reference: dict | None, tiny_model, tmp_path, monkeypatch) -> dict:
    """Train the tiny DPO recipe in the backend's own environment and check: the checkpoint contract, two logged
    steps, and a first loss of ln 2 within 1e-4 (the policy is the reference at step 0). With trl_cpu's first step
    as `reference` (a backend that draws the same first batch): the same loss within 1e-3 and the same
    log-probabilities of the batch's answers (the same prepared tokens in the same rows). Returns the first logged
    step."""
    ensure_backend_env(backend)
    monkeypatch.chdir(REPO)  # the backend finds its interpreter under .venvs/
    run, history = dpo_run(backend, tiny_model, tmp_path)
    metrics = assert_checkpoint_contract(run["checkpoint"], tiny_model, backend)
    assert metrics["steps"] == 2 and [entry["step"] for entry in metrics["loss"]] == [1, 2]
    first = next(entry for entry in history if "loss" in entry)
    assert abs(first["loss"] - math.log(2)) < 1e-4, f"first DPO loss {first['loss']}: the policy is the reference"
    if reference:
        assert abs(first["loss"] - reference["loss"]) < 1e-3
        for key in ("logps/chosen", "logps/rejected"):
            assert first[key] == pytest.approx(reference[key], rel=1e-4), f"{key}: {first[key]} vs {reference[key]}"
    return first


def assert_each_step_rewarded(steps: list[dict]) -> None:
    """Each logged GRPO step of the tests' recipe (a format reward and rewards/words.py:short at weight 0.5, KL weight
    above 0, completions of at most 8 tokens): the rewards' means, their weighted sum, KL and completion length."""
    for step in steps:
        format_mean, words_mean = step["rewards/format/mean"], step["rewards/rewards/words.py:short/mean"]
        assert 0 <= format_mean <= 1 and -0.8 <= words_mean <= 0
        assert step["reward"] == pytest.approx(format_mean + 0.5 * words_mean, abs=1e-5)  # summed by weight
        assert 0 < step["completions/mean_length"] <= 8
        assert step["kl"] >= 0  # logged with train.rl.kl_weight above 0
