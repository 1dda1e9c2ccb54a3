"""The primus backend: its translation to a Primus post-training experiment and its launch commands. Primus
needs AMD GPUs with ROCm, so nothing here trains; the keys checked are those Primus' docs and examples use
(cited in docs/backends.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from xtrain.artifacts import read_json
from xtrain.errors import XtrainError
from xtrain.plan import make_plan
from xtrain.recipe import Hardware, Lora, Train
from xtrain.train.backends import registry as backends
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.primus import IMAGE, launch_command, launch_entry, lora_targets
from xtrain.train.backends.registry import get_backend

ROCM = Hardware(accelerator="rocm", gpus=8, gpu_model="mi300x")


def written_config(tiny_model, prepared, tmp_path, train: Train, hardware: Hardware = ROCM) -> tuple[dict, dict]:
    plan = make_plan(tiny_model, read_json(prepared / "manifest.json"), train, hardware)
    job = TrainJob(tiny_model, prepared, plan, train, hardware, tmp_path / "demo", tmp_path / "runs", None)
    config = get_backend("primus").write_config(job)["config_file"]
    return plan, yaml.safe_load(config.read_text())


def test_lora_recipe_becomes_an_iteration_based_posttrain_experiment(tiny_model, prepared, tmp_path):
    train = Train(method="lora", lora=Lora(r=8, alpha=16, dropout=0.0), global_batch_size=16, epochs=2,
                  learning_rate=1e-4, warmup_ratio=0.1, lr_scheduler="cosine", seed=7)
    plan, experiment = written_config(tiny_model, prepared, tmp_path, train)
    for key in ("work_group", "user_name", "exp_name", "workspace"):  # PrimusParser.parse_meta_info requires them
        assert experiment[key]
    module = experiment["modules"]["post_trainer"]
    assert module["framework"] == "megatron_bridge" and module["config"] == "sft_trainer.yaml"
    # Primus loads model presets only from its own configs folder (preset_loader.py): a shipped one, by name.
    assert module["model"] == "llama3_8b.yaml"
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
    assert overrides["finetune_lr"] == 1e-4 and overrides["scheduler"] == {"lr_decay_style": "cosine"}
    assert overrides["lr_warmup_iters"] == -(-overrides["train_iters"] // 10)
    assert overrides["precision_config"] == {"bf16": "bf16_mixed", "fp32": "fp32", "fp16": "fp16_mixed"}[plan.precision]
    assert overrides["rng"] == {"seed": 7}
    assert overrides["optimizer"] == {"weight_decay": Train().weight_decay, "clip_grad": Train().max_grad_norm}
    assert (overrides["tensor_model_parallel_size"], overrides["pipeline_model_parallel_size"]) == (1, 1)
    assert overrides["recipe"] == "llama.llama3" and overrides["flavor"] == "llama3_8b_finetune_config"
    assert Path(overrides["hf_path"]) == tiny_model.resolve()
    dataset = overrides["dataset"]
    assert dataset["_target_"] == "megatron.bridge.data.builders.hf_dataset.HFDatasetConfig"
    assert dataset["seq_length"] == 128


def test_the_exported_dataset_holds_the_prepared_tokens_and_mask(tiny_model, prepared, tmp_path):
    from datasets import Dataset, load_from_disk

    _, experiment = written_config(tiny_model, prepared, tmp_path, Train(method="full", global_batch_size=8))
    exported = load_from_disk(experiment["modules"]["post_trainer"]["overrides"]["dataset"]["dataset_name"])
    source = Dataset.from_parquet(str(prepared / "train.parquet"))
    assert exported["train"]["input_ids"] == source["input_ids"]
    first_ids, first_mask = source[0]["input_ids"], source[0]["assistant_masks"]
    assert exported["train"][0]["labels"] == [t if m else -100 for t, m in zip(first_ids, first_mask)]
    assert len(exported["validation"]) == read_json(prepared / "manifest.json")["splits"]["eval"]["rows"]


def test_full_fine_tune_has_no_peft_settings(tiny_model, prepared, tmp_path):
    _, experiment = written_config(tiny_model, prepared, tmp_path, Train(method="full", global_batch_size=8))
    overrides = experiment["modules"]["post_trainer"]["overrides"]
    assert overrides["peft"] == "none"
    assert not any(key.startswith("peft_") for key in overrides)


def test_one_node_launches_primus_direct_with_its_gpu_count(tmp_path):
    config = tmp_path / "primus_posttrain.yaml"
    tail = ["--", "train", "posttrain", "--config", str(config)]
    # primus-cli starts GPUS_PER_NODE processes and defaults it to 8: one GPU says so.
    one = Hardware(accelerator="rocm", gpus=1, gpu_model="mi300x")
    assert launch_command(config, one, ["direct"]) == ["primus-cli", "direct", "--env", "GPUS_PER_NODE=1", *tail]
    assert launch_command(config, ROCM, ["direct"]) == ["primus-cli", "direct", "--env", "GPUS_PER_NODE=8", *tail]


def test_without_primus_installed_one_node_runs_its_container_with_the_project_mounted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "primus_posttrain.yaml"
    project = str(tmp_path.resolve())
    assert launch_command(config, ROCM, launch_entry(direct=False)) == [
        "primus-cli", "container", "--image", IMAGE, "--volume", f"{project}:{project}", "--env", "GPUS_PER_NODE=8",
        "--", "train", "posttrain", "--config", str(config)]


def test_two_nodes_start_one_primus_entry_per_node_through_its_slurm_launcher(tmp_path):
    config = tmp_path / "primus_posttrain.yaml"
    two_nodes = Hardware(accelerator="rocm", gpus=8, nodes=2, gpu_model="mi300x")
    # Primus' Slurm entry takes NNODES, NODE_RANK and the rendezvous host (the allocation's first) from Slurm.
    assert launch_command(config, two_nodes, ["direct"]) == [
        "primus-cli", "slurm", "srun", "-N", "2", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1", "--",
        "direct", "--env", "GPUS_PER_NODE=8", "--", "train", "posttrain", "--config", str(config)]


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
