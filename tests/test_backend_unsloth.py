"""The unsloth backend: its refusals, its DPO and GRPO jobs, and real SFT, DPO and GRPO runs in its own environment
(SFT and DPO compared with trl_cpu)."""

from __future__ import annotations

import pytest
from backend_runs import (
    ensure_backend_env,
    tiny_dpo,
    tiny_grpo,
    train_tiny_dpo_with_backend,
    train_tiny_grpo_with_backend,
    train_tiny_recipe_with_backend,
)
from backend_runs import tiny_train as backend_train
from backend_runs import trl_cpu_dpo_reference, trl_cpu_grpo_reference, trl_cpu_reference  # noqa: F401 (fixtures)
from conftest import sample_plan

from xtrain.errors import XtrainError
from xtrain.recipe import Hardware, Lora, Preference, Reward, Rl, Train
from xtrain.train.backends import registry as backends
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import get_backend


def tiny_train(**changes) -> Train:
    return backend_train("unsloth", **changes)


def test_more_than_one_gpu_rocm_and_cpu_processes_are_refused_by_its_capabilities():
    backends.check("unsloth", tiny_train(), Hardware(accelerator="cuda", gpus=1))
    for hardware, fix in ((Hardware(accelerator="cuda", gpus=8), "set hardware.gpus: 1"),
                          (Hardware(accelerator="rocm", gpus=1), "set hardware.accelerator: cpu"),
                          (Hardware(processes=2), "set hardware.processes: 1")):
        with pytest.raises(XtrainError, match=fix):
            backends.check("unsloth", tiny_train(), hardware)


def test_one_gpu_trains_with_the_plans_autocast_and_a_16_bit_lora_base(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    rows = pa.table({"input_ids": [[1, 2]], "assistant_masks": [[0, 1]]})
    pq.write_table(rows, tmp_path / "prepared" / "train.parquet")
    plan = sample_plan(precision="bf16", weights_dtype="bf16")
    gpu = TrainJob(tmp_path / "model", tmp_path / "prepared", plan, tiny_train(), Hardware(accelerator="cuda", gpus=1),
                   tmp_path / "out", tmp_path / "work", None)
    launch = get_backend("unsloth").native(gpu)
    assert launch["job"]["weights_dtype"] == "bf16"
    assert (launch["job"]["trainer"]["use_cpu"], launch["job"]["trainer"]["bf16"]) == (False, True)
    assert launch["argv"][0] == ".venvs/unsloth-cuda/bin/python"
    cpu = TrainJob(tmp_path / "model", tmp_path / "prepared", plan, tiny_train(), Hardware(), tmp_path / "out",
                   tmp_path / "work", None)
    assert get_backend("unsloth").native(cpu)["job"]["weights_dtype"] == "fp32"


def test_all_linear_targets_are_refused_with_the_names_to_list():
    with pytest.raises(XtrainError, match=r"target_modules \['all-linear'\].*list the module names"):
        get_backend("unsloth").check(tiny_train(lora=Lora(target_modules=["all-linear"])), Hardware())


def test_a_dpo_job_hands_the_runner_trl_cpus_dpo_arguments_and_the_pair_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"prompt_ids": [[1]], "chosen_ids": [[2]], "rejected_ids": [[3]]}),
                   tmp_path / "prepared" / "train.parquet")
    train = tiny_dpo("unsloth", preference=Preference(beta=0.3, loss_type="hinge"))
    job = TrainJob(tmp_path / "model", tmp_path / "prepared", sample_plan(), train, Hardware(), tmp_path / "out",
                   tmp_path / "work", None)
    described = get_backend("unsloth").native(job)["job"]
    assert described["objective"] == "dpo" and described["columns"] == ["prompt_ids", "chosen_ids", "rejected_ids"]
    arguments = described["trainer"]
    assert (arguments["beta"], arguments["loss_type"], arguments["disable_dropout"]) == (0.3, ["hinge"], False)
    assert "packing" not in arguments


def test_kto_and_orpo_jobs_carry_their_own_settings(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"prompt_ids": [[1]], "completion_ids": [[2]], "label": [True]}),
                   tmp_path / "prepared" / "train.parquet")
    for objective, settings, expected in (("kto", {"desirable_weight": 2.0}, {"desirable_weight": 2.0, "beta": 0.1}),
                                          ("orpo", {"beta": 0.2}, {"beta": 0.2})):
        train = tiny_dpo("unsloth", objective=objective, preference=Preference(**settings))
        job = TrainJob(tmp_path / "model", tmp_path / "prepared", sample_plan(), train, Hardware(), tmp_path / "out",
                       tmp_path / "work", None)
        described = get_backend("unsloth").native(job)["job"]
        assert described["objective"] == objective
        assert {key: described["trainer"][key] for key in expected} == expected
        assert "loss_type" not in described["trainer"], "DPO only"


def test_a_grpo_job_hands_the_runner_trl_cpus_grpo_arguments_the_prompt_columns_and_the_rewards(tmp_path,
                                                                                              monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"prompt": ["Q?"], "prompt_ids": [[1, 2]], "answer": ["4"], "row_hash": ["ab"]}),
                   tmp_path / "prepared" / "train.parquet")
    train = tiny_grpo("unsloth", rl=Rl(generations=8, kl_weight=0.04, loss_type="bnpo", steps_per_generation=2),
                      rewards=[Reward(type="answer", weight=2.0),
                               Reward(type="python", file="rewards/words.py", function="short")])
    job = TrainJob(tmp_path / "model", tmp_path / "prepared", sample_plan(), train, Hardware(), tmp_path / "out",
                   tmp_path / "work", None)
    described = get_backend("unsloth").native(job)["job"]
    assert described["objective"] == "grpo" and described["columns"] == ["prompt", "answer", "row_hash"]
    arguments = described["trainer"]
    assert {key: arguments[key] for key in ("num_generations", "beta", "loss_type", "steps_per_generation",
                                            "reward_weights", "use_vllm", "disable_dropout")} == {
        "num_generations": 8, "beta": 0.04, "loss_type": "bnpo", "steps_per_generation": 2,
        "reward_weights": [2.0, 1.0], "use_vllm": False, "disable_dropout": False}
    assert "max_length" not in arguments and "packing" not in arguments
    # The runner builds the guarded rewards from these, the user's file read from the project (the working folder).
    assert described["rewards"] == [{"type": "answer"},
                                    {"type": "python", "file": "rewards/words.py", "function": "short"}]
    assert described["project"] == str(tmp_path.resolve())


@pytest.mark.slow
def test_unsloth_trains_grpo_with_xtrains_rewards(trl_cpu_grpo_reference, tiny_model, tmp_path,
                                                monkeypatch):
    # Unsloth's model and LoRA under TRL 1.15's GRPOTrainer (on the CPU Unsloth leaves it unpatched: its patched
    # trainer is for GPUs) for two real steps, scored by xtrain's guarded built-in reward and the project's own
    # reward file in the runner's interpreter; step 1 scores as trl_cpu's.
    train_tiny_grpo_with_backend("unsloth", trl_cpu_grpo_reference, tiny_model, tmp_path, monkeypatch)


@pytest.mark.slow
def test_unsloth_trains_dpo_from_ln2_on_the_prepared_tokens(trl_cpu_dpo_reference, tiny_model, tmp_path, monkeypatch):
    # Unsloth's model and LoRA under the DPOTrainer trl_cpu uses (trainer_parts.preference_trainer), on the same rows.
    train_tiny_dpo_with_backend("unsloth", trl_cpu_dpo_reference, tiny_model, tmp_path, monkeypatch)


@pytest.mark.slow
def test_unsloth_trains_the_tiny_recipe_like_trl_cpu(trl_cpu_reference, tiny_model, tmp_path, monkeypatch):
    # Both backends build SFTTrainer from the same `sft_arguments` on the same prepared rows with the same seed:
    # step 1's loss was seen equal to 5 digits on 2026-12-02 (on the CPU Unsloth falls back to transformers'
    # forward, with its chunked cross-entropy).
    metrics = train_tiny_recipe_with_backend("unsloth", trl_cpu_reference, tiny_model, tmp_path, monkeypatch)
    assert metrics["tokens_seen"] == trl_cpu_reference["tokens_seen"], "the same rows, the same non-padding tokens"


@pytest.mark.slow
def test_the_runners_config_for_one_gpu_is_accepted_by_the_unsloth_environments_trl(tiny_model, prepared, tmp_path):
    """The lane's validation (the smoke stage's launch step): the shared TRL arguments, through the runner's
    translation, build the unsloth environment's SFTConfig as an H100 would (bf16 autocast, use_cpu off)."""
    ensure_backend_env("unsloth")
    job = TrainJob(tiny_model, prepared, sample_plan(precision="bf16", weights_dtype="bf16"), tiny_train(),
                   Hardware(accelerator="cuda", gpus=1), tmp_path / "out", tmp_path / "work", None)
    backend = get_backend("unsloth")
    read_back = backend.validate(job, backend.native(job), tmp_path / "validate")["read_back"]
    assert (read_back["config_class"], read_back["bf16"], read_back["fp16"]) == ("SFTConfig", True, False)
    # GRPO: the shared arguments with train.rl's, as the unsloth environment's (older) GRPOConfig reads them.
    grpo = TrainJob(tiny_model, prepared, sample_plan(precision="bf16", weights_dtype="bf16"),
                    tiny_grpo("unsloth", rl=Rl(kl_weight=0.04, steps_per_generation=2)),
                    Hardware(accelerator="cuda", gpus=1), tmp_path / "out", tmp_path / "work", None)
    read_back = backend.validate(grpo, backend.native(grpo), tmp_path / "validate-grpo")["read_back"]
    assert (read_back["config_class"], read_back["bf16"]) == ("GRPOConfig", True)
