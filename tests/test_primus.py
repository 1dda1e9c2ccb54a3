"""The primus backend: its translation to a Primus post-training experiment and its launch commands. Primus
needs AMD GPUs with ROCm, so nothing here trains; the keys checked are those Primus' docs and examples use
(cited in docs/backends.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from xtrain import backends
from xtrain.artifacts import read_json
from xtrain.backends import TrainJob, get_backend
from xtrain.backends.primus import launch_command, lora_targets
from xtrain.errors import XtrainError
from xtrain.plan import make_plan
from xtrain.recipe import Hardware, Lora, Train

ROCM = Hardware(accelerator="rocm", gpus=8, gpu_model="mi300x")


def written_config(tiny_model, prepared, tmp_path, train: Train, hardware: Hardware = ROCM) -> tuple[dict, dict, dict]:
    plan = make_plan(tiny_model, read_json(prepared / "manifest.json"), train, hardware)
    job = TrainJob(tiny_model, prepared, plan, train, hardware, tmp_path / "demo", tmp_path / "runs", None)
    config = get_backend("primus").write_config(job)["config_file"]
    experiment = yaml.safe_load(config.read_text())
    preset = yaml.safe_load(Path(experiment["modules"]["post_trainer"]["model"]).read_text())
    return plan, experiment, preset


def test_lora_recipe_becomes_an_iteration_based_posttrain_experiment(tiny_model, prepared, tmp_path):
    train = Train(method="lora", lora=Lora(r=8, alpha=16, dropout=0.0), global_batch_size=16, epochs=2,
                  learning_rate=1e-4, warmup_ratio=0.1, lr_scheduler="cosine", seed=7)
    plan, experiment, preset = written_config(tiny_model, prepared, tmp_path, train)
    for key in ("work_group", "user_name", "exp_name", "workspace"):  # PrimusParser.parse_meta_info requires them
        assert experiment[key]
    module = experiment["modules"]["post_trainer"]
    assert module["framework"] == "megatron_bridge" and module["config"] == "sft_trainer.yaml"
    overrides = module["overrides"]
    rows = read_json(prepared / "manifest.json")["splits"]["train"]["rows"]
    # epochs -> train_iters: ceil(rows / global batch) x epochs, the plan's step count.
    assert overrides["train_iters"] == plan.time.steps == -(-rows // 16) * 2
    layout = plan.layout
    assert overrides["global_batch_size"] == 16
    assert overrides["micro_batch_size"] == layout.micro_batch_size
    # Megatron derives accumulation = global / (micro x data parallel); it must be the plan's.
    data_parallel = ROCM.gpus * ROCM.nodes
    assert overrides["global_batch_size"] // (overrides["micro_batch_size"] * data_parallel) == \
        layout.gradient_accumulation_steps
    assert overrides["seq_length"] == 128 and overrides["packed_sequence"] is False
    assert (overrides["peft"], overrides["peft_dim"], overrides["peft_alpha"]) == ("lora", 8, 16)
    assert overrides["peft_target_modules"] == ["linear_qkv", "linear_proj"]
    assert overrides["finetune_lr"] == 1e-4 and overrides["lr_decay_style"] == "cosine"
    assert overrides["lr_warmup_iters"] == -(-overrides["train_iters"] // 10)
    assert overrides["precision_config"] == {"bf16": "bf16_mixed", "fp32": "fp32", "fp16": "fp16_mixed"}[plan.precision]
    assert overrides["seed"] == 7
    assert (overrides["tensor_model_parallel_size"], overrides["pipeline_model_parallel_size"]) == (1, 1)
    assert preset["recipe"] == "llama.llama3" and preset["flavor"].endswith("_finetune_config")
    assert Path(preset["hf_path"]) == tiny_model.resolve()
    dataset = preset["dataset"]
    assert dataset["_target_"] == "megatron.bridge.data.builders.hf_dataset.HFDatasetConfig"
    assert dataset["seq_length"] == 128


def test_the_exported_dataset_holds_the_prepared_tokens_and_mask(tiny_model, prepared, tmp_path):
    from datasets import Dataset, load_from_disk

    _, _, preset = written_config(tiny_model, prepared, tmp_path, Train(method="full", global_batch_size=8))
    exported = load_from_disk(preset["dataset"]["dataset_name"])
    source = Dataset.from_parquet(str(prepared / "train.parquet"))
    assert exported["train"]["input_ids"] == source["input_ids"]
    first_ids, first_mask = source[0]["input_ids"], source[0]["assistant_masks"]
    assert exported["train"][0]["labels"] == [t if m else -100 for t, m in zip(first_ids, first_mask)]
    assert len(exported["validation"]) == read_json(prepared / "manifest.json")["splits"]["eval"]["rows"]


def test_full_fine_tune_has_no_peft_settings(tiny_model, prepared, tmp_path):
    _, experiment, _ = written_config(tiny_model, prepared, tmp_path, Train(method="full", global_batch_size=8))
    overrides = experiment["modules"]["post_trainer"]["overrides"]
    assert overrides["peft"] == "none"
    assert not any(key.startswith("peft_") for key in overrides)


def test_launch_commands_are_argument_lists_for_each_mode(tmp_path):
    config = tmp_path / "primus_posttrain.yaml"
    tail = ["--", "train", "posttrain", "--config", str(config)]
    assert launch_command(config, ROCM, "direct") == ["primus-cli", "direct", *tail]
    two_nodes = Hardware(accelerator="rocm", gpus=8, nodes=2)
    assert launch_command(config, two_nodes, "slurm") == ["primus-cli", "slurm", "srun", "-N", "2", *tail]
    container = launch_command(config, ROCM, "container")
    assert container[:4] == ["primus-cli", "container", "--image", "rocm/primus:v26.8"]
    assert container[-5:] == tail


def test_check_refuses_what_primus_cannot_honour():
    primus = get_backend("primus")
    with pytest.raises(XtrainError, match="hardware.accelerator rocm, not 'cpu'"):
        backends.check("primus", Train(), Hardware())
    with pytest.raises(XtrainError, match="hardware.accelerator rocm, not 'cuda'"):
        backends.check("primus", Train(), Hardware(accelerator="cuda", gpus=1))
    with pytest.raises(XtrainError, match="translate-only in this version"):
        backends.check("primus", Train(), ROCM)
    with pytest.raises(XtrainError, match="adapts q_proj, k_proj, v_proj together"):
        primus.check(Train(lora=Lora(target_modules=["q_proj", "v_proj"])), ROCM)
    with pytest.raises(XtrainError, match=r"\['lm_head'\]"):
        primus.check(Train(lora=Lora(target_modules=["lm_head"])), ROCM)
    primus.check(Train(lora=Lora(target_modules=["all-linear"])), ROCM)
    assert lora_targets(["all-linear"]) == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def test_run_without_primus_cli_says_it_needs_a_rocm_machine(tiny_model, prepared, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no primus-cli anywhere
    train = Train(method="lora", global_batch_size=8)
    plan = make_plan(tiny_model, read_json(prepared / "manifest.json"), train, ROCM)
    job = TrainJob(tiny_model, prepared, plan, train, ROCM, tmp_path / "demo", tmp_path / "runs", None)
    with pytest.raises(XtrainError, match="needs a ROCm machine with Primus installed"):
        get_backend("primus").run(job)
    assert not (tmp_path / "runs").exists(), "nothing is written before the refusal"
