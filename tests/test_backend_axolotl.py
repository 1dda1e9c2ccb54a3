"""The axolotl backend: its translation checked by Axolotl's own config loader, its refusals, the preference data it
trains as text, and real SFT and DPO runs."""

from __future__ import annotations

import os

import pytest
import yaml
from backend_runs import (
    PAIRS,
    ensure_backend_env,
    tiny_dpo,
    tiny_grpo,
    train_tiny_dpo_with_backend,
    train_tiny_grpo_with_backend,
    train_tiny_recipe_with_backend,
)
from backend_runs import tiny_train as backend_train
from backend_runs import trl_cpu_dpo_reference, trl_cpu_grpo_reference, trl_cpu_reference  # noqa: F401 (fixtures)
from conftest import REPO, sample_plan

from xtrain.data import prepare
from xtrain.errors import XtrainError
from xtrain.plan import Plan
from xtrain.recipe import Data, DataSource, Hardware, Lora, Preference, Reward, Rl, Train
from xtrain.train.backends import registry as backends
from xtrain.train.backends.axolotl import (
    OFFLINE,
    Axolotl,
    axolotl_config,
    export_prompts,
    export_tokens,
    precision_keys,
)
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.preference_text import export_text
from xtrain.train.backends.validation import device_probe, validated

PYTHON = str(REPO / ".venvs" / "axolotl" / "bin" / "python")


def load_with_axolotl(configs: list[tuple[dict, Hardware]], tmp_path) -> list[dict]:
    """Axolotl's loader (the one `axolotl train` uses) on each config, in one process (importing Axolotl takes
    seconds), its device probe answering what the hardware's GPU reports: what it read back for each key (a key
    its schema does not know fails the call)."""
    requests = []
    for index, (config, hardware) in enumerate(configs):
        path = tmp_path / f"axolotl-{index}.yaml"
        path.write_text(yaml.safe_dump(config))
        requests.append({"framework": "axolotl", "config_file": str(path), "keys": list(config),
                         **device_probe(hardware)})
    return validated(PYTHON, requests, tmp_path / "validate", env=OFFLINE)


def tiny_train(**changes) -> Train:
    return backend_train("axolotl", **changes)


def plan(**changes) -> Plan:
    return sample_plan(**{"precision": "fp32", "gradient_checkpointing": False, "data": {"seq_len": 128},
                          "layout": {"micro_batch_size": 2, "gradient_accumulation_steps": 2},
                          "time": {"steps": 40, "seconds_per_step": 30.0}, **changes})


def job(tmp_path, train, plan_, model=None, hardware=None) -> TrainJob:
    return TrainJob(model or tmp_path / "model", tmp_path / "prepared", plan_, train, hardware or Hardware(),
                    tmp_path / "out", tmp_path / "work", None)


def test_cpu_processes_and_cpu_nodes_are_refused_with_the_field_to_change():
    # Axolotl under torchrun on the CPU fails loading the model (docs/backends.md gives its error).
    with pytest.raises(XtrainError, match=r"1 CPU process\(es\) per node at most.*set hardware.processes: 1"):
        backends.check("axolotl", tiny_train(), Hardware(processes=2))
    with pytest.raises(XtrainError, match="runs CPU training on one node: set hardware.nodes: 1"):
        backends.check("axolotl", tiny_train(), Hardware(nodes=2))
    for hardware in (Hardware(accelerator="cuda", gpus=1), Hardware(accelerator="rocm", gpus=8, nodes=2)):
        backends.check("axolotl", tiny_train(), hardware)


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "mi[07-08]", "MASTER_PORT": "29611"}


@pytest.mark.parametrize("hardware, env, launcher", [
    (Hardware(), {}, []),
    (Hardware(accelerator="cuda", gpus=1), {}, ["-m", "torch.distributed.run", "--nproc-per-node=1", "--standalone"]),
    (Hardware(accelerator="rocm", gpus=8), {}, ["-m", "torch.distributed.run", "--nproc-per-node=8", "--standalone"]),
    (Hardware(accelerator="rocm", gpus=8, nodes=2), SLURM, [
        "-m", "torch.distributed.run", "--nproc-per-node=8", "--nnodes=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=mi07:29611", "--rdzv-id=4242"]),
], ids=["cpu", "1-gpu", "8-gpus", "2-nodes"])
def test_the_launch_is_axolotls_cli_alone_on_the_cpu_and_under_torchrun_on_gpus(tmp_path, hardware, env, launcher,
                                                                                 monkeypatch):
    monkeypatch.setattr("xtrain.train.backends.axolotl.fsdp_keys", lambda job: {})  # no model folder here
    launch = Axolotl().native(job(tmp_path, tiny_train(), plan(precision="bf16"), hardware=hardware), env)
    python = launch["argv"][launch["argv"].index("-m") - 1]
    srun = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1"]
    assert launch["argv"] == [*(srun if hardware.nodes > 1 else []), python, *launcher, "-m", "axolotl.cli.train",
                              str(tmp_path / "work" / "axolotl.yaml")]
    assert python == {"cpu": ".venvs/axolotl/bin/python", "cuda": ".venvs/axolotl-cuda/bin/python",
                      "rocm": "python"}[hardware.accelerator], "the lane's environment for the accelerator"


def test_the_plans_precision_sets_axolotls_dtype_switches_on_a_gpu(tmp_path, caplog):
    cuda = Hardware(accelerator="cuda", gpus=1)
    assert precision_keys(job(tmp_path, tiny_train(), plan(precision="bf16"), hardware=cuda)) == {
        "bf16": True, "fp16": False, "tf32": False}
    assert precision_keys(job(tmp_path, tiny_train(), plan(precision="fp16"), hardware=cuda)) == {
        "bf16": False, "fp16": True, "tf32": False}
    assert caplog.text == ""
    precision_keys(job(tmp_path, tiny_train(method="full", lora=None), plan(precision="bf16"), hardware=cuda))
    assert "also loads the weights in bf16, so this full fine-tune keeps weights, gradients and optimizer states " \
           "in bf16" in caplog.text


def test_an_fsdp_plan_shards_each_decoder_block_with_fsdp2(tiny_model, tmp_path):
    hardware = Hardware(accelerator="cuda", gpus=8)
    config = axolotl_config(job(tmp_path, tiny_train(), plan(precision="bf16", gradient_checkpointing=True,
                                                             layout={"strategy": "fsdp"}),
                                model=tiny_model, hardware=hardware), tmp_path / "d.parquet")
    assert config["fsdp_version"] == 2 and config["gradient_checkpointing"] is False
    assert config["fsdp_config"] == {
        "offload_params": False, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": "LlamaDecoderLayer", "reshard_after_forward": True,
        "state_dict_type": "FULL_STATE_DICT", "activation_checkpointing": True}
    ddp = axolotl_config(job(tmp_path, tiny_train(), plan(precision="bf16", layout={"strategy": "ddp"}),
                             model=tiny_model, hardware=hardware), tmp_path / "d.parquet")
    assert not any(key.startswith("fsdp") for key in ddp)


def test_packed_data_is_refused_with_the_field_to_change():
    with pytest.raises(XtrainError, match="set data.packing: false"):
        backends.check("axolotl", tiny_train(), Hardware(), packed=True)


def test_export_keeps_the_prepared_tokens_and_masks_the_unsupervised_ones(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"input_ids": [[5, 6, 7, 8], [9, 10]], "assistant_masks": [[0, 0, 1, 1], [1, 0]]}),
                   tmp_path / "prepared" / "train.parquet")
    assert export_tokens(tmp_path / "prepared", tmp_path / "train.parquet") == 2
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert rows == [
        {"input_ids": [5, 6, 7, 8], "attention_mask": [1, 1, 1, 1], "labels": [-100, -100, 7, 8]},
        {"input_ids": [9, 10], "attention_mask": [1, 1], "labels": [9, -100]},
    ]


def test_checkpoint_minutes_becomes_the_steps_the_plan_predicts_for_them(tmp_path):
    config = axolotl_config(job(tmp_path, tiny_train(checkpoint_minutes=2), plan()), tmp_path / "d.parquet")
    assert config["save_steps"] == 4  # 120 s / 30 s per step, sooner than a quarter of 40 steps
    config = axolotl_config(job(tmp_path, tiny_train(checkpoint_minutes=60), plan()), tmp_path / "d.parquet")
    assert config["save_steps"] == 10  # a quarter of the run


def test_a_bf16_plan_trains_in_fp32_on_the_cpu_and_says_so(tmp_path, caplog):
    config = axolotl_config(job(tmp_path, tiny_train(), plan(precision="bf16")), tmp_path / "d.parquet")
    assert config["bf16"] is False and config["fp16"] is False
    assert "the plan's bf16 autocast -> fp32" in caplog.text
    with pytest.raises(XtrainError, match="plan precision 'fp16' cannot run on the CPU"):
        precision_keys(job(tmp_path, tiny_train(), plan(precision="fp16")))


def test_preference_settings_land_in_axolotls_rl_keys(tmp_path):
    dpo = axolotl_config(job(tmp_path, tiny_dpo("axolotl", preference=Preference(beta=0.3, loss_type="ipo")), plan()),
                         tmp_path / "d.parquet")
    assert {key: dpo[key] for key in ("rl", "rl_beta", "dpo_loss_type", "excess_length_strategy", "group_by_length")} \
        == {"rl": "dpo", "rl_beta": 0.3, "dpo_loss_type": ["ipo"], "excess_length_strategy": "raise",
            "group_by_length": False}
    assert "ds_type" not in dpo["datasets"][0] and not any(key.startswith("kto_") for key in dpo)
    kto = axolotl_config(job(tmp_path, tiny_dpo("axolotl", objective="kto", preference=Preference(
        desirable_weight=2.0, undesirable_weight=0.5)), plan()), tmp_path / "d.parquet")
    assert (kto["rl"], kto["kto_desirable_weight"], kto["kto_undesirable_weight"]) == ("kto", 2.0, 0.5)
    assert "dpo_loss_type" not in kto


def test_a_lora_dropout_with_a_preference_objective_is_refused_by_name():
    with pytest.raises(XtrainError, match=r"train.lora.dropout 0.05 with train.objective dpo.*train.lora.dropout: 0"):
        backends.check("axolotl", tiny_train(objective="dpo"), Hardware())
    backends.check("axolotl", tiny_dpo("axolotl"), Hardware())
    # TRL's GRPOTrainer keeps dropout (its disable_dropout is off by default), as trl_cpu does.
    backends.check("axolotl", tiny_grpo("axolotl", lora=Lora(dropout=0.05)), Hardware())


def test_grpo_settings_land_in_axolotls_trl_section_and_the_rewards_by_dotted_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train = tiny_grpo("axolotl", rl=Rl(generations=8, max_completion_length=32, temperature=0.7, top_p=0.9,
                                       kl_weight=0.04, clip_epsilon=0.3, loss_type="dr_grpo", steps_per_generation=3),
                      rewards=[Reward(type="answer", weight=2.0), Reward(type="format", pattern="^A"),
                               Reward(type="python", file="rewards/words.py", function="short", weight=0.5)])
    launch = Axolotl().native(job(tmp_path, train, plan()))
    config = launch["config"]
    assert (config["rl"], config["remove_unused_columns"], config["group_by_length"]) == ("grpo", False, False)
    assert config["trainer_cls"] == "xtrain_backend_side.axolotl_grpo.Trainer"
    assert "ds_type" not in config["datasets"][0] and "rl_beta" not in config
    module = "xtrain_backend_side.axolotl_grpo"
    assert config["trl"] == {
        "num_generations": 8, "max_completion_length": 32, "temperature": 0.7, "top_p": 0.9, "beta": 0.04,
        "epsilon": 0.3, "loss_type": "dr_grpo", "scale_rewards": "group",
        "reward_funcs": [f"{module}.reward_0", f"{module}.reward_1", f"{module}.reward_2"],
        "reward_weights": [2.0, 1.0, 0.5], "use_vllm": False,
        "generation_batch_size": 2 * 1 * 3,  # micro-batch x processes x steps per generation (TRL's relation)
    }
    # What axolotl_grpo builds the rewards from in Axolotl's process, and how that process finds it.
    assert launch["rewards_job"] == {"project": str(tmp_path.resolve()), "rewards": [
        {"type": "answer"}, {"type": "format", "pattern": "^A"},
        {"type": "python", "file": "rewards/words.py", "function": "short"}]}
    assert launch["env"]["XTRAIN_GRPO_REWARDS"] == str(launch["rewards_file"].resolve())
    assert launch["env"]["PYTHONPATH"] == str(REPO / "src")
    default = Axolotl().native(job(tmp_path, tiny_grpo("axolotl"), plan()))["config"]["trl"]
    assert "generation_batch_size" not in default, "TRL's default: one generation per optimizer step"


def test_grpo_prompts_are_exported_as_text_with_the_columns_the_rewards_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.table({"prompt": ["<s>Q: 2+2?\nA:"], "prompt_ids": [[1, 5, 6]], "answer": ["4"],
                             "row_hash": ["ab12"]}), tmp_path / "prepared" / "train.parquet")
    assert export_prompts(tmp_path / "prepared", tmp_path / "train.parquet") == 1
    assert pq.read_table(tmp_path / "train.parquet").to_pylist() == [
        {"prompt": "<s>Q: 2+2?\nA:", "answer": "4", "row_hash": "ab12"}]


@pytest.fixture(scope="module")
def prepared_pairs(tiny_model, tmp_path_factory):
    data = Data(sources=[DataSource(path=str(PAIRS))], seq_len=128, eval_fraction=0.1)
    out = tmp_path_factory.mktemp("pairs") / "prepared"
    prepare([PAIRS], tiny_model, data, out, kind="pairs")
    return out


def test_pairs_become_text_that_tokenizes_back_to_the_prepared_ids(prepared_pairs, tiny_model, tmp_path):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    rows = export_text(prepared_pairs, tiny_model, tmp_path / "text.parquet", "axolotl", False)
    prepared = pq.read_table(prepared_pairs / "train.parquet").to_pylist()
    text = pq.read_table(tmp_path / "text.parquet").to_pylist()
    assert rows == len(prepared) == len(text) > 0 and set(text[0]) == {"prompt", "chosen", "rejected"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for ids, row in zip(prepared, text):  # as TRL 1.9's DPOTrainer tokenizes them (the answers end with EOS)
        prompt = tokenizer(text=row["prompt"])["input_ids"]
        assert prompt == ids["prompt_ids"]
        for answer in ("chosen", "rejected"):
            assert row[answer].endswith(tokenizer.eos_token)
            assert tokenizer(text=row["prompt"] + row[answer])["input_ids"][len(prompt):] == ids[f"{answer}_ids"]


def test_text_that_does_not_tokenize_back_is_refused_naming_the_row(prepared_pairs, tiny_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    # A word the tokenizer holds as one token, given as its single characters' tokens: decoding joins them.
    word = next(token for token in ("the", "is", "plus", "of") if len(tokenizer(text=token)["input_ids"]) == 1)
    split = tokenizer.convert_tokens_to_ids(list(word)) + [tokenizer.eos_token_id]
    rows = pq.read_table(prepared_pairs / "train.parquet").to_pylist()
    rows[1]["chosen_ids"] = split
    (tmp_path / "prepared").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "prepared" / "train.parquet")
    with pytest.raises(XtrainError, match=r"train.parquet row 1: train.backend axolotl trains preference data as text.*"
                                          r"chosen_ids.*train.backend trl_cpu or trl_local"):
        export_text(tmp_path / "prepared", tiny_model, tmp_path / "text.parquet", "axolotl", False)
    assert not (tmp_path / "text.parquet").exists()


@pytest.mark.slow
def test_axolotls_loader_accepts_the_translation_and_reads_every_field_as_meant(tiny_model, tmp_path):
    ensure_backend_env("axolotl")
    trains = [
        tiny_train(lr_scheduler="linear", warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=0.5, seed=3,
                   lora=Lora(r=4, alpha=8, dropout=0.1, target_modules=["q_proj", "v_proj"])),
        tiny_train(method="full", max_steps=None, epochs=2, lr_scheduler="constant"),
        tiny_train(lora=Lora(target_modules=["all-linear"])),
        tiny_dpo("axolotl", preference=Preference(beta=0.2, loss_type="hinge")),
        tiny_dpo("axolotl", objective="kto", method="full", lora=None,
                 preference=Preference(desirable_weight=1.5, undesirable_weight=0.5)),
        tiny_grpo("axolotl", rl=Rl(generations=4, max_completion_length=16, temperature=0.8, top_p=0.95,
                                   kl_weight=0.02, clip_epsilon=0.25, loss_type="bnpo", steps_per_generation=2)),
        # Every tracker: Axolotl's own keys for each (xtrain.train.tracking.axolotl_settings).
        tiny_train(report_to=["tensorboard", "mlflow", "wandb"], mlflow_tracking_uri="file:mlruns"),
    ]
    configs = [axolotl_config(job(tmp_path, train, plan(precision="bf16", gradient_checkpointing=True),
                                  model=tiny_model), tmp_path / "d.parquet") for train in trains]
    loaded = load_with_axolotl([(config, Hardware()) for config in configs], tmp_path)
    assert len(loaded) == len(trains)
    for train, config, cfg in zip(trains, configs, loaded):
        for key in ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "weight_decay",
                    "max_grad_norm", "seed", "sequence_len", "bf16", "gradient_checkpointing", "save_steps", "lora_r",
                    "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear", "max_steps",
                    "warmup_ratio", "rl_beta", "dpo_loss_type", "kto_desirable_weight", "kto_undesirable_weight",
                    "excess_length_strategy", "group_by_length", "use_tensorboard", "use_mlflow", "mlflow_tracking_uri",
                    "wandb_project"):
            if key in config:
                assert cfg[key] == config[key], key
        assert cfg["num_epochs"] == train.epochs
        assert cfg["lr_scheduler"] == train.lr_scheduler
        assert cfg["optimizer"] == "adamw_torch_fused"
        assert (cfg.get("adapter") == "lora") == (train.method == "lora")
        assert (cfg.get("rl") or "sft") == train.objective
        if "trl" in config:  # GRPO: Axolotl's TRL section reads every key as written
            assert {key: cfg["trl"][key] for key in config["trl"]} == config["trl"]
            assert cfg["trainer_cls"] == config["trainer_cls"]


# Each GPU shape the lane claims, as the plan would lay it out: (hardware, recipe, precision, strategy, gc).
GPU_SHAPES = {
    "h100-1-lora-sft": (Hardware(accelerator="cuda", gpus=1), tiny_train(), "bf16", "single", False),
    "h100-8-lora-dpo": (Hardware(accelerator="cuda", gpus=8), tiny_dpo("axolotl"), "bf16", "ddp", False),
    "mi300x-8-full-fsdp": (Hardware(accelerator="rocm", gpus=8), tiny_train(method="full", lora=None), "bf16", "fsdp",
                           True),
    "mi300x-2x8-full-fsdp": (Hardware(accelerator="rocm", gpus=8, nodes=2), tiny_train(method="full", lora=None),
                             "bf16", "fsdp", True),
    "v100-8-lora-kto": (Hardware(accelerator="cuda", gpus=8, gpu_model="v100"), tiny_dpo("axolotl", objective="kto"),
                        "fp16", "ddp", True),
    # QLoRA (nf4, double quantization) with the LoRA variants and NEFTune (issue 36).
    "h100-1-qlora-variants": (Hardware(accelerator="cuda", gpus=1), tiny_train(
        method="qlora", lora=Lora(use_dora=True, use_rslora=True, modules_to_save=["lm_head"]),
        neftune_noise_alpha=5.0), "bf16", "single", False),
    # GRPO: one group of 4 completions per step (Axolotl checks that each process's micro-batch x accumulation holds
    # whole groups: num_generations x processes at least).
    "h100-1-lora-grpo": (Hardware(accelerator="cuda", gpus=1), tiny_grpo("axolotl"), "bf16", "single", False),
}


def gpu_job(tiny_model, tmp_path, hardware, train, precision, strategy, checkpointing) -> TrainJob:
    devices = hardware.devices
    layout = {"strategy": strategy, "devices": devices, "nodes": hardware.nodes, "micro_batch_size": 2,
              "gradient_accumulation_steps": 2, "global_batch_size": 4 * devices}
    return job(tmp_path, train, plan(precision=precision, gradient_checkpointing=checkpointing, layout=layout),
               model=tiny_model, hardware=hardware)


@pytest.mark.slow
def test_axolotls_loader_accepts_every_gpu_shape_with_that_gpus_capabilities(tiny_model, tmp_path):
    ensure_backend_env("axolotl")
    configs = {name: axolotl_config(gpu_job(tiny_model, tmp_path, *shape), tmp_path / "d.parquet")
               for name, shape in GPU_SHAPES.items()}
    loaded = load_with_axolotl([(configs[name], shape[0]) for name, shape in GPU_SHAPES.items()], tmp_path)
    assert len(loaded) == len(GPU_SHAPES)
    for (name, (hardware, *_)), cfg in zip(GPU_SHAPES.items(), loaded):
        config = configs[name]
        for key in ("bf16", "fp16", "fsdp_version", "gradient_checkpointing", "micro_batch_size",
                    "gradient_accumulation_steps", "rl", "adapter", "load_in_4bit", "bnb_config_kwargs",
                    "peft_use_dora", "peft_use_rslora", "lora_modules_to_save", "neftune_noise_alpha", "trainer_cls"):
            assert cfg.get(key) == config.get(key), f"{name}: {key}"
        if "fsdp_config" in config:
            assert {key: cfg["fsdp_config"].get(key) for key in config["fsdp_config"]} == config["fsdp_config"], name
        # Axolotl's own batch arithmetic over torchrun's world size gives the plan's global batch.
        assert cfg["world_size"] == hardware.devices
        assert cfg["batch_size"] == 4 * hardware.devices, name


@pytest.mark.slow
def test_validate_refuses_what_axolotl_says_will_fail_on_that_gpu(tiny_model, tmp_path):
    """bf16 on a V100 (no bf16): Axolotl's loader only warns that training will fail; the lane's validation (the
    smoke stage's launch step) makes that an error before any GPU is allocated."""
    ensure_backend_env("axolotl")
    the_job = gpu_job(tiny_model, tmp_path, Hardware(accelerator="cuda", gpus=8, gpu_model="v100"), tiny_train(),
                      "bf16", "ddp", False)
    with pytest.raises(XtrainError, match="bf16 requested, but AMP is not supported on this GPU"):
        Axolotl().validate(the_job, Axolotl().native(the_job), tmp_path / "validate")


@pytest.mark.slow
def test_a_grpo_batch_axolotl_refuses_on_several_gpus_is_refused_before_any_job(tiny_model, tmp_path, monkeypatch):
    """64 completions per step, 8 per prompt, on 8 GPUs: TRL's trainer takes it (the batch counted over all devices
    holds 8 whole groups), Axolotl's validator does not (per device, 8 < generations x devices = 64). Preflight
    (`registry.check`) says so before any job, and Axolotl's own loader agrees on both sides of the line."""
    monkeypatch.chdir(tmp_path)  # the GRPO config records the project the rewards are read from
    ensure_backend_env("axolotl")
    gpus = Hardware(accelerator="cuda", gpus=8, gpu_model="h100")
    refused, accepted = (tiny_grpo("axolotl", rl=Rl(generations=8, max_completion_length=16), global_batch_size=size)
                         for size in (64, 512))
    with pytest.raises(XtrainError, match=r"GRPO generation batch is 8 completions \(train.global_batch_size 64 over "
                                          r"8 device\(s\)\).*at least 64.*multiple of 512.*trl_local"):
        backends.check("axolotl", refused, gpus)
    backends.check("axolotl", accepted, gpus)
    backends.check("trl_local", refused, gpus)

    def rendered(train: Train, micro: int, accumulation: int) -> dict:
        layout = {"strategy": "ddp", "devices": 8, "nodes": 1, "micro_batch_size": micro,
                  "gradient_accumulation_steps": accumulation, "global_batch_size": train.global_batch_size}
        return axolotl_config(job(tmp_path, train, plan(precision="bf16", layout=layout), model=tiny_model,
                                  hardware=gpus), tmp_path / "d.parquet")

    # One loader process (importing Axolotl takes seconds), which stops at its first refusal: the refused recipe's
    # (got 8), so the accepted one before it (64) loaded.
    with pytest.raises(XtrainError, match=r"requires effective_gbs >= num_generations \* world_size = 64, got 8"):
        load_with_axolotl([(rendered(accepted, 8, 8), gpus), (rendered(refused, 2, 4), gpus)], tmp_path)


@pytest.mark.slow
def test_axolotl_trains_the_tiny_recipe_like_trl_cpu(trl_cpu_reference, tiny_model, tmp_path, monkeypatch):
    # Same prepared tokens and labels in the same order (Axolotl's own shuffle is off), the same seed and the same
    # length-grouped sampler (Axolotl's trainer is transformers' Trainer): step 1's loss was seen equal to 5
    # digits, 6.98145, on 2026-12-02; with Axolotl's shuffle on it was 6.97258, another batch.
    train_tiny_recipe_with_backend("axolotl", trl_cpu_reference, tiny_model, tmp_path, monkeypatch)


@pytest.mark.slow
def test_axolotl_trains_dpo_from_ln2_on_the_prepared_tokens(trl_cpu_dpo_reference, tiny_model, tmp_path, monkeypatch):
    # Axolotl's `rl: dpo` (TRL 1.9's DPOTrainer) on the pairs as text: the same log-probabilities of the first batch's
    # answers as trl_cpu's on the prepared ids.
    train_tiny_dpo_with_backend("axolotl", trl_cpu_dpo_reference, tiny_model, tmp_path, monkeypatch)


AXOLOTL_GRPO_CHECK = """
import os, sys
from axolotl.core.trainers.grpo import GRPOStrategy
from axolotl.core.trainers.grpo.trainer import AxolotlGRPOTrainer
from axolotl.utils.import_helper import get_cls_from_module_str
from xtrain_backend_side import axolotl_grpo
trainer = get_cls_from_module_str("xtrain_backend_side.axolotl_grpo.Trainer")
assert issubclass(trainer, AxolotlGRPOTrainer) and "_tokenize_prompts" in vars(trainer), trainer.__mro__
answer = GRPOStrategy.get_reward_func("xtrain_backend_side.axolotl_grpo.reward_0")
own = GRPOStrategy.get_reward_func("xtrain_backend_side.axolotl_grpo.reward_1")
assert answer.__name__ == "answer" and answer(prompts=["p"], completions=["#### 4"], answer=["4"]) == [1.0]
assert own.__name__ == "rewards/mine.py:score" and own(prompts=["p"], completions=["a b"]) == [2.0]
os.environ["XTRAIN_GRPO_REWARDS"] = sys.argv[1]  # a job whose user file lies outside rewards/
axolotl_grpo.terms.cache_clear()
try:
    GRPOStrategy.get_reward_func("xtrain_backend_side.axolotl_grpo.reward_0")
except Exception as error:
    print("REFUSED", type(error).__name__, error)
"""


@pytest.mark.slow
def test_axolotl_imports_xtrains_trainer_and_guarded_rewards_and_refuses_a_reward_file_outside_rewards(tmp_path):
    """What Axolotl's GRPO loads by the dotted paths of its config, as it loads them (its own import helpers): the
    trainer that keeps the prepared prompt tokens, each guarded reward (a user's from the project's rewards/), and
    no user file from outside rewards/ (the whole job is refused)."""
    import json
    import subprocess

    ensure_backend_env("axolotl")
    (tmp_path / "rewards").mkdir()
    score = "def score(completions, **kwargs):\n    return [float(len(c.split())) for c in completions]\n"
    (tmp_path / "rewards/mine.py").write_text(score)
    (tmp_path / "evil.py").write_text(score)
    jobs = {}
    for name, file in (("good", "rewards/mine.py"), ("outside", "rewards/../evil.py")):
        jobs[name] = tmp_path / f"{name}.json"
        jobs[name].write_text(json.dumps({"project": str(tmp_path), "rewards": [
            {"type": "answer"}, {"type": "python", "file": file, "function": "score"}]}))
    result = subprocess.run([PYTHON, "-c", AXOLOTL_GRPO_CHECK, str(jobs["outside"])], capture_output=True, text=True,
                            timeout=600, env={**os.environ, **OFFLINE, "PYTHONPATH": str(REPO / "src"),
                                              "XTRAIN_GRPO_REWARDS": str(jobs["good"])})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"REFUSED RewardError train.rewards: rewards/../evil.py resolves to {tmp_path / 'evil.py'}, outside " \
           f"{tmp_path / 'rewards'}" in result.stdout


@pytest.mark.slow
def test_axolotl_trains_grpo_with_xtrains_rewards(trl_cpu_grpo_reference, tiny_model, tmp_path,
                                                monkeypatch):
    # Axolotl's `rl: grpo` (TRL 1.9's GRPOTrainer under Axolotl's trainer) for two real steps on the CPU, scored by
    # xtrain's guarded built-in reward and the project's own reward file, imported in Axolotl's process by the
    # dotted paths of its config; step 1 scores as trl_cpu's.
    train_tiny_grpo_with_backend("axolotl", trl_cpu_grpo_reference, tiny_model, tmp_path, monkeypatch)
