"""The torchtune backend: the translation (checked by `tune validate`), a real few-step run of the tiny
recipe in torchtune's own environment against trl_cpu's run of the same recipe, and a real DPO run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from backend_runs import ensure_backend_env, tiny_dpo, train_tiny_dpo_with_backend
from checkpoint_contract import assert_checkpoint_contract
from conftest import REPO, build_run, sample_plan

from xtrain.artifacts import read_json
from xtrain.errors import XtrainError
from xtrain.plan import read_plan
from xtrain.recipe import Hardware, Lora, Preference, Quantization, Train
from xtrain.stage import run_command
from xtrain.train.backends import registry as backends
from xtrain.train.backends import torchtune as torchtune_backend
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.registry import get_backend
from xtrain_backend_side import BACKEND_SIDE_PATH
from xtrain_backend_side import torchtune_components as tt

# Dropout off and one logged loss per step, so the first step's loss is the base model's loss on a batch.
STEPS = 4


def tiny_train(backend: str) -> Train:
    return Train(backend=backend, method="lora", lora=Lora(r=8, alpha=16, dropout=0.0), global_batch_size=4,
                 max_steps=STEPS, learning_rate=5e-3, logging_steps=1)


@pytest.fixture(scope="module")
def torchtune_env(monkeypatch_module) -> None:
    monkeypatch_module.chdir(REPO)  # backend_python looks for .venvs/ under the working directory
    ensure_backend_env("torchtune")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module", autouse=True)
def fp32_plans(monkeypatch_module):
    """Both backends train in fp32 here, whatever this CPU offers: the plan would pick bf16 on a CPU with
    native bf16, which trl_cpu runs as autocast and torchtune as bf16 weights, and the logits comparison
    below is exact only in fp32 (the backend's own check allows for bf16 rounding)."""
    monkeypatch_module.setattr("xtrain.plan.planner.cpu_supports_bf16", lambda: False)


@pytest.fixture(scope="module")
def trl_reference(tiny_model, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("trl"), tiny_model, tiny_train("trl_cpu"))


@pytest.fixture(scope="module")
def tune_run(tiny_model, tmp_path_factory, torchtune_env, monkeypatch_module):
    """The tiny recipe through the torchtune backend. torchtune's own output (its merged weights) is copied
    aside while the backend exports it, since run_training removes the work folder once the checkpoint is done."""
    kept = tmp_path_factory.mktemp("torchtune-output")
    export = torchtune_backend.export_checkpoint

    def keep_and_export(epoch_dir: Path, *args):
        shutil.copytree(epoch_dir, kept, dirs_exist_ok=True)
        return export(epoch_dir, *args)

    monkeypatch_module.setattr(torchtune_backend, "export_checkpoint", keep_and_export)
    run = build_run(tmp_path_factory.mktemp("torchtune"), tiny_model, tiny_train("torchtune"))
    return {**run, "torchtune_output": kept}


@pytest.mark.slow
def test_torchtune_trains_the_tiny_recipe_into_the_checkpoint_contract(tune_run, trl_reference, tiny_model):
    assert read_plan(tune_run["plan"]).precision == "fp32"
    metrics = assert_checkpoint_contract(tune_run["checkpoint"], tiny_model, "torchtune")
    assert [entry["step"] for entry in metrics["loss"]] == list(range(1, STEPS + 1))
    assert metrics["tokens_seen"] > 0
    # The default train.report_to: torchtune's TensorBoardLogger beside its DiskLogger (xtrain_backend_side.tracking),
    # which writes new-style (tensor) scalars.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (folder,) = (tune_run["runs"] / "tensorboard").iterdir()
    events = EventAccumulator(str(folder))
    events.Reload()
    assert {"loss", "lr", "grad_norm", "tokens_per_second_per_gpu", "peak_host_memory_mib"} <= set(events.Tags()["tensors"])
    assert [event.step for event in events.Tensors("loss")] == list(range(1, STEPS + 1))
    reference = json.loads((trl_reference["checkpoint"] / "train_metrics.json").read_text())
    # The first step's loss is the base model's loss on the first batch (the adapters start at zero). The
    # backends draw different first batches (torchtune: its sampler's seed-0 permutation over our seeded row
    # order; TRL: its length-grouped sampler), so this compares the same model on two samples of the same
    # prepared data: on the random-init tiny model the loss is near ln(vocab) for any batch.
    first, first_reference = metrics["loss"][0]["loss"], reference["loss"][0]["loss"]
    assert first == pytest.approx(first_reference, rel=0.02)
    report = json.loads(tune_run["report"].read_text())
    assert report["tuned_loss"] < report["base_loss"]


@pytest.mark.slow
def test_the_exported_adapter_gives_the_model_torchtune_trained(tune_run, tiny_model):
    """Logits of base + the exported PEFT adapter (loaded as a user would) against the weights torchtune
    merged itself: the adapter export must not permute or scale anything differently."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    checkpoint, output = tune_run["checkpoint"], tune_run["torchtune_output"]
    assert not (checkpoint / "model.safetensors").exists(), "only the adapter: merged weights would apply it twice"
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), checkpoint).eval()
    merged = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    state = {}
    for path in output.glob("model-*.safetensors"):
        state.update(load_file(str(path)))
    missing, unexpected = merged.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    tokens = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        expected, got = merged(tokens).logits, tuned(tokens).logits
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()(tokens).logits
    assert (expected - base).abs().max() > 1e-3, "training changed the model"
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()


@pytest.mark.slow
def test_tune_validate_accepts_the_full_fine_tune_translation(tiny_model, trl_reference, torchtune_env, tmp_path):
    train = Train(backend="torchtune", method="full", global_batch_size=4, epochs=2, lr_scheduler="linear",
                  warmup_ratio=0.1, weight_decay=0.01)
    plan = read_plan(trl_reference["plan"])
    rows = read_json(trl_reference["prepared"] / "manifest.json")["splits"]["train"]["rows"]
    steps_per_epoch = rows // plan.layout.micro_batch_size // plan.layout.gradient_accumulation_steps
    # what the plan gives for epochs: 2 when no row is left over
    plan = plan.model_copy(update={"time": plan.time.model_copy(update={"steps": 2 * steps_per_epoch})})
    job = TrainJob(tiny_model, trl_reference["prepared"], plan, train, Hardware(), tmp_path / "out", tmp_path, None)
    config = torchtune_backend.torchtune_config(job, rows, packed=False)
    assert config["model"]["_component_"].endswith("llama3_2") and "lora_rank" not in config["model"]
    assert config["model"]["scale_factor"] == 1 and config["model"]["tie_word_embeddings"] is True
    assert config["epochs"] == 2 and config["max_steps_per_epoch"] is None
    path = tmp_path / "torchtune.yaml"
    path.write_text(yaml.safe_dump(config))
    python = torchtune_backend.backend_python("torchtune", "torchtune")
    run_command([python, "-m", "torchtune._cli.tune", "validate", str(path)], env={"PYTHONPATH": BACKEND_SIDE_PATH})


def test_lora_targets_map_to_torchtune_names_or_are_refused():
    assert torchtune_backend.lora_layout(["q_proj", "v_proj", "o_proj"]) == (["q_proj", "v_proj", "output_proj"], False)
    assert torchtune_backend.lora_layout(["all-linear"]) == (["q_proj", "k_proj", "v_proj", "output_proj"], True)
    assert torchtune_backend.lora_layout(["q_proj", "gate_proj", "up_proj", "down_proj"]) == (["q_proj"], True)
    with pytest.raises(XtrainError, match="adapts gate_proj, up_proj, down_proj together"):
        torchtune_backend.lora_layout(["q_proj", "up_proj"])
    with pytest.raises(XtrainError, match=r"\['lm_head'\]"):
        torchtune_backend.lora_layout(["lm_head"])


def test_check_takes_any_gpu_shape_and_refuses_cpu_processes_naming_the_fix():
    """torchtune 0.6.1's distributed recipes fail on the CPU (docs/backends.md quotes how), so CPU training is one
    process; GPUs of either vendor, any count and nodes run."""
    for hardware in (Hardware(), Hardware(accelerator="cuda", gpus=1), Hardware(accelerator="cuda", gpus=8),
                     Hardware(accelerator="rocm", gpus=8, nodes=2)):
        backends.check("torchtune", Train(backend="torchtune"), hardware)
    with pytest.raises(XtrainError, match="1 CPU process.* not hardware.processes 2: set hardware.processes: 1.*"
                                          "backends that run these settings: .*trl_local"):
        backends.check("torchtune", Train(backend="torchtune"), Hardware(processes=2))
    with pytest.raises(XtrainError, match="together"):
        get_backend("torchtune").check(Train(backend="torchtune", lora=Lora(target_modules=["down_proj"])), Hardware())


def test_dpo_becomes_the_lora_dpo_recipe_with_the_recipes_loss(tiny_model, tmp_path):
    def config(**preference) -> dict:
        job = TrainJob(tiny_model, tmp_path / "prepared", sample_plan(time={"steps": 2}),
                       tiny_dpo("torchtune", preference=Preference(**preference)), Hardware(), tmp_path / "out",
                       tmp_path, None)
        return torchtune_backend.torchtune_config(job, 54, packed=False)

    sigmoid, hinge = config(beta=0.3), config(beta=0.3, loss_type="hinge")
    assert sigmoid["loss"] == {"_component_": "torchtune.rlhf.loss.DPOLoss", "beta": 0.3}
    assert hinge["loss"] == {"_component_": "torchtune.rlhf.loss.RSOLoss", "gamma": 0.3}
    assert sigmoid["dataset"] == {"_component_": f"{torchtune_backend.COMPONENTS}.prepared_pairs",
                                  "path": str(tmp_path / "prepared" / "train.parquet"), "seed": 0}
    assert "clip_grad_norm" not in sigmoid, "the DPO recipe does not clip (said in the log)"
    assert torchtune_backend.recipe_name(tiny_dpo("torchtune"), Hardware()) == "lora_dpo_single_device"


def test_what_torchtune_cannot_train_with_dpo_is_refused_by_name():
    backend = get_backend("torchtune")
    with pytest.raises(XtrainError, match=r"loss_type 'ipo'.*sigmoid and hinge only.*loss_type: sigmoid"):
        backend.check(tiny_dpo("torchtune", preference=Preference(loss_type="ipo")), Hardware())
    with pytest.raises(XtrainError, match="would run full_dpo_distributed.*do not run on the CPU.*set train.method: "
                                          "lora .*or train on a GPU"):
        backend.check(tiny_dpo("torchtune", method="full", lora=None), Hardware())
    backend.check(tiny_dpo("torchtune", method="full", lora=None), Hardware(accelerator="cuda", gpus=1))
    with pytest.raises(XtrainError, match="does not train objective 'kto'"):
        backends.check("torchtune", tiny_dpo("torchtune", objective="kto"), Hardware())


def test_pairs_component_gives_each_answer_after_its_prompt_labelled_on_the_answer(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt_ids": [5, 6, 7], "chosen_ids": [8, 2], "rejected_ids": [9, 10, 2]},
            {"prompt_ids": [11], "chosen_ids": [12, 2], "rejected_ids": [13, 2]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    dataset = tt.PreparedPairs(str(tmp_path / "train.parquet"), seed=1)
    assert len(dataset) == 2
    for index in range(2):
        row = rows[dataset.order[index]]
        prompt = row["prompt_ids"]
        assert dataset[index] == {
            "chosen_input_ids": prompt + row["chosen_ids"], "chosen_labels": [-100] * len(prompt) + row["chosen_ids"],
            "rejected_input_ids": prompt + row["rejected_ids"],
            "rejected_labels": [-100] * len(prompt) + row["rejected_ids"],
        }


@pytest.mark.slow
def test_torchtune_trains_dpo_from_ln2(tiny_model, tmp_path, monkeypatch):
    # lora_dpo_single_device on the prepared pairs; its sampler draws another first batch than trl_cpu's, and at
    # step 0 the loss is ln 2 on any batch.
    train_tiny_dpo_with_backend("torchtune", None, tiny_model, tmp_path, monkeypatch)


def test_steps_become_whole_epochs_or_a_cap_within_one():
    assert torchtune_backend.epochs_and_cap(3, 10) == (1, 3)
    assert torchtune_backend.epochs_and_cap(20, 10) == (2, None)
    with pytest.raises(XtrainError, match="1.50 epochs of 10 steps"):
        torchtune_backend.epochs_and_cap(15, 10)


def test_metric_log_becomes_trainer_style_history(tmp_path):
    log = tmp_path / "log_1.txt"
    log.write_text("".join(f"Step {step} | loss:{step}.0 lr:0.1 tokens_per_second_per_gpu:10.0 grad_norm:1.0\n"
                           for step in range(1, 8)))
    history = torchtune_backend.log_history(log, logging_steps=3)
    # step 1 alone, then the mean since the last entry at 3, 6, and the last step (7).
    assert [(entry["step"], entry["loss"]) for entry in history] == [(1, 1.0), (3, 2.5), (6, 5.0), (7, 7.0)]
    log.write_text("nothing\n")
    with pytest.raises(XtrainError, match="logged no training step"):
        torchtune_backend.log_history(log, logging_steps=1)


@pytest.fixture(scope="module")
def packed_prepared(tiny_model, tmp_path_factory) -> Path:
    from xtrain.data import prepare
    from xtrain.recipe import Data, DataSource

    data = Data(sources=[DataSource(path=str(REPO / "data/demo/chat.jsonl"))], seq_len=128, packing=True)
    out = tmp_path_factory.mktemp("packed") / "prepared"
    prepare([REPO / "data/demo/chat.jsonl"], tiny_model, data, out)
    return out


def test_dataset_component_gives_torchtune_the_prepared_tokens(packed_prepared):
    """Packed rows in torchtune's pack format (a run on them was checked by hand: see docs/backends.md)."""
    import pyarrow.parquet as pq

    path = str(packed_prepared / "train.parquet")
    rows = pq.read_table(path).to_pylist()
    dataset = tt.PreparedTokens(path, packed=True, seed=3, seq_len=128, pad_id=99)
    assert len(dataset) == len(rows)
    row = rows[dataset.order[0]]
    sample = dataset[0]
    used = len(row["input_ids"])
    assert sample["tokens"].tolist() == row["input_ids"] + [99] * (128 - used)
    assert sample["labels"][:used].tolist() == [t if m else -100 for t, m in zip(row["input_ids"], row["assistant_masks"])]
    assert set(sample["labels"][used:].tolist()) <= {-100}
    assert sample["seq_lens"].sum() == 128 and sample["seq_lens"][: len(row["seq_lengths"])].tolist() == row["seq_lengths"]
    assert sample["input_pos"][: row["seq_lengths"][0]].tolist() == list(range(row["seq_lengths"][0]))
    assert tt.PreparedTokens(path, packed=True, seed=4, seq_len=128).order != dataset.order, "the seed orders the rows"
    with pytest.raises(ValueError, match="dataset.packed is False but the rows are packed"):
        tt.PreparedTokens(path, packed=False)


def test_rows_trained_follow_torchtunes_sampler():
    """torchtune 0.6.1 draws from a DistributedSampler(num_replicas=1, seed=0) subclass, reseeded by epoch."""
    from torch.utils.data import DistributedSampler

    order = tt.row_order(10, seed=5)
    sampler = DistributedSampler(range(10), num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    expected = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        expected += [order[i] for i in list(sampler)[:8]]
    assert tt.rows_trained(10, seed=5, epochs=2, rows_per_epoch=8) == expected


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant", "constant_with_warmup"])
def test_lr_scheduler_walks_transformers_curve(schedule):
    from transformers import get_scheduler

    curves = []
    for make in (lambda o: tt.lr_scheduler(o, 20, schedule, warmup_ratio=0.15),
                 lambda o: get_scheduler(schedule, o, num_warmup_steps=0 if schedule == "constant" else 3,
                                         num_training_steps=20)):
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        scheduler, curve = make(optimizer), []
        for _ in range(20):
            curve.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        curves.append(curve)
    assert curves[0] == pytest.approx(curves[1], abs=1e-12)


def fake_tune_run(monkeypatch, tmp_path: Path, log: str) -> list[list[str]]:
    """torchtune's commands replaced: `tune run` only writes `log` as its step log. Returns the commands run."""
    commands = []

    def fake_torchtune(command, **kwargs):
        commands.append(command)
        if "run" in command:
            logs = tmp_path / "runs" / "torchtune" / "logs"
            logs.mkdir(parents=True)
            (logs / "log_1.txt").write_text(log)

    monkeypatch.setattr(torchtune_backend, "backend_python", lambda backend, module, **_: "python")
    monkeypatch.setattr(torchtune_backend, "run_command", fake_torchtune)
    return commands


def test_a_non_finite_loss_stops_the_backend_before_any_checkpoint(tiny_model, packed_prepared, tmp_path, monkeypatch):
    """torchtune itself steps on NaN gradients; the backend reads its log and refuses to export."""
    from xtrain.plan import make_plan

    train = Train(backend="torchtune", global_batch_size=4, max_steps=2, logging_steps=1, report_to=[])  # no tracker: python has none
    plan = make_plan(tiny_model, read_json(packed_prepared / "manifest.json"), train, Hardware())
    job = TrainJob(tiny_model, packed_prepared, plan, train, Hardware(), tmp_path / "out", tmp_path / "runs", None)

    # what `tune run` leaves when the loss blows up at step 2
    fake_tune_run(monkeypatch, tmp_path, "Step 1 | loss:6.9 lr:0.0002\nStep 2 | loss:nan lr:0.0002\n")
    with pytest.raises(XtrainError, match="NaN or infinite by step 2"):
        get_backend("torchtune").run(job)
    assert not (tmp_path / "out").exists()


TUNE = ["/env/bin/python", "-m", "torchtune._cli.tune", "run"]
OVERRIDES = ["--config", "/runs/torchtune.yaml", "device=cuda", "dtype=bf16", "compile=False",
             "log_peak_memory_stats=True"]
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def tune_launch(hardware: Hardware, env: dict[str, str], train: Train | None = None) -> list[str]:
    recipe = torchtune_backend.recipe_name(train or Train(backend="torchtune"), hardware)
    return torchtune_backend.launch_command("/env/bin/python", recipe, Path("/runs/torchtune.yaml"), "cuda", "bf16",
                                            hardware, env)


def test_one_gpu_runs_the_single_device_recipe():
    assert tune_launch(Hardware(accelerator="cuda", gpus=1), {}) == [*TUNE, "lora_finetune_single_device", *OVERRIDES]


def test_eight_gpus_run_the_distributed_recipe_one_process_each():
    full = Train(backend="torchtune", method="full", lora=None)
    assert tune_launch(Hardware(accelerator="cuda", gpus=8), {}, full) == [
        *TUNE, "--nproc-per-node=8", "--standalone", "full_finetune_distributed", *OVERRIDES]


def test_two_nodes_run_one_tune_per_node_under_srun_with_the_rendezvous_on_the_first_host():
    assert tune_launch(Hardware(accelerator="cuda", gpus=8, nodes=2), SLURM) == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1",
        *TUNE, "--nproc-per-node=8", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29500",
        "--rdzv-id=4242", "lora_finetune_distributed", *OVERRIDES]
    with pytest.raises(XtrainError, match="SLURM_JOB_ID is not set"):
        tune_launch(Hardware(accelerator="cuda", gpus=8, nodes=2), {})


def test_two_cpu_processes_are_refused_naming_the_fix():
    """What `tune run --nproc-per-node=2 lora_finetune_distributed ... device=cpu` would be fails in torchtune
    0.6.1 (NCCL asked for on a CPU torch; memory stats read from the CPU device): refused before, with the fix."""
    with pytest.raises(XtrainError, match="would run lora_finetune_distributed.*do not run on the CPU.*set "
                                          "hardware.processes: 1"):
        tune_launch(Hardware(processes=2), {})


def distributed_config(tiny_model, tmp_path, train: Train, hardware: Hardware, **layout) -> dict:
    plan = sample_plan(layout=layout, time={"steps": 44})
    job = TrainJob(tiny_model, tmp_path / "prepared", plan, train, hardware, tmp_path / "out", tmp_path, None)
    return torchtune_backend.torchtune_config(job, 352, packed=False)


def test_the_plans_layout_becomes_the_distributed_recipes_fsdp_settings(tiny_model, tmp_path, caplog):
    eight = Hardware(accelerator="cuda", gpus=8)
    layout = {"devices": 8, "micro_batch_size": 2, "gradient_accumulation_steps": 1, "global_batch_size": 16}
    sharded = distributed_config(tiny_model, tmp_path, Train(backend="torchtune"), eight, strategy="fsdp", **layout)
    assert sharded["fsdp_reshard_after_forward"] is True and sharded["fsdp_cpu_offload"] is False
    # 352 rows over 8 devices: 44 each, 22 steps of 2 per epoch, so the plan's 44 steps are two whole epochs.
    assert (sharded["batch_size"], sharded["epochs"], sharded["max_steps_per_epoch"]) == (2, 2, None)
    replicated = distributed_config(tiny_model, tmp_path, Train(backend="torchtune"), eight, strategy="ddp", **layout)
    assert replicated["fsdp_reshard_after_forward"] is False
    with caplog.at_level("INFO"):
        torchtune_backend.log_sharding(sample_plan(layout={"strategy": "ddp", **layout}).layout, replicated)
    assert "plan layout ddp -> torchtune FSDP2 with fsdp_reshard_after_forward: False" in caplog.text
    assert "1/8 of the gradients and optimizer states" in caplog.text
    single = distributed_config(tiny_model, tmp_path, Train(backend="torchtune"), Hardware(accelerator="cuda", gpus=1))
    assert "fsdp_reshard_after_forward" not in single


def test_full_dpo_gets_its_reference_checkpointer_and_clipping_lora_dpo_none(tiny_model, tmp_path):
    one_gpu, full_dpo = Hardware(accelerator="cuda", gpus=1), tiny_dpo("torchtune", method="full", lora=None)
    full = distributed_config(tiny_model, tmp_path, full_dpo, one_gpu)
    assert torchtune_backend.recipe_name(full_dpo, one_gpu) == "full_dpo_distributed"
    assert full["ref_checkpointer"] == full["checkpointer"] and full["clip_grad_norm"] == 1.0
    assert full["fsdp_reshard_after_forward"] is False  # one device: nothing to shard
    lora = distributed_config(tiny_model, tmp_path, tiny_dpo("torchtune"), Hardware(accelerator="cuda", gpus=2),
                              strategy="ddp", devices=2, micro_batch_size=4, global_batch_size=8)
    assert "clip_grad_norm" not in lora and "ref_checkpointer" not in lora


def test_rows_trained_over_devices_follow_torchtunes_distributed_sampler():
    """Each device's sampler pads the permutation to a multiple of the device count with its first rows."""
    from torch.utils.data import DistributedSampler

    order = tt.row_order(10, seed=5)
    expected = []
    for epoch in range(2):
        drawn = []
        for rank in range(3):
            sampler = DistributedSampler(range(10), num_replicas=3, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            drawn.append(list(sampler)[:4])  # 4 rows per device: the 12 of the padded permutation
        expected += sorted(order[i] for i in sum(drawn, []))
    trained = tt.rows_trained(10, seed=5, epochs=2, rows_per_epoch=12, replicas=3)
    assert sorted(trained[:12]) == expected[:12] and sorted(trained[12:]) == expected[12:]
    assert len(set(trained[:12])) == 10, "two rows drawn twice: the padding"


# Every hardware shape the lane claims (capabilities), and what each recipe the lane runs is given on it.
SHAPES = {"cpu": Hardware(), "1 cuda": Hardware(accelerator="cuda", gpus=1),
          "8 cuda": Hardware(accelerator="cuda", gpus=8), "1 rocm": Hardware(accelerator="rocm", gpus=1),
          "8 rocm": Hardware(accelerator="rocm", gpus=8),
          "2 nodes x 8 cuda": Hardware(accelerator="cuda", gpus=8, nodes=2)}
KINDS = [{}, {"method": "full", "lora": None}, {"objective": "dpo", "preference": Preference()},
         {"objective": "dpo", "preference": Preference(), "method": "full", "lora": None},
         # QLoRA (its NF4 base) with DoRA: quantize_base and use_dora on the LoRA builder (issue 36).
         {"method": "qlora", "quantization": Quantization(), "lora": Lora(use_dora=True)}]
# `tune validate` on each file, in one interpreter: each start of torchtune's CLI costs seconds.
VALIDATE = ("import sys\nfrom torchtune._cli.tune import main\nfor path in sys.argv[1:]:\n"
            "    sys.argv = ['tune', 'validate', path]\n    main()\n")


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_config_for_every_claimed_shape_passes_tune_validate(shape, tiny_model, prepared, torchtune_env,
                                                                    tmp_path):
    """The plan's layout (micro-batch, accumulation, checkpointing, strategy) lands as is in each config, and
    torchtune's own `tune validate` accepts it."""
    from xtrain.plan import make_plan

    hardware = SHAPES[shape]
    base = Train(backend="torchtune", global_batch_size=16, max_steps=4, report_to=[])
    plan = make_plan(tiny_model, read_json(prepared / "manifest.json"), base, hardware)
    rows = read_json(prepared / "manifest.json")["splits"]["train"]["rows"]
    files = []
    for index, kind in enumerate(KINDS):
        train = base.model_copy(update=kind)
        if shape == "cpu" and train.objective == "dpo" and train.method == "full":
            continue  # full_dpo_distributed only: refused on the CPU (test above)
        job = TrainJob(tiny_model, prepared, plan, train, hardware, tmp_path / "out", tmp_path, None)
        config = torchtune_backend.torchtune_config(job, rows, packed=False)
        layout = plan.layout
        settings = ("batch_size", "gradient_accumulation_steps", "enable_activation_checkpointing")
        assert [config[key] for key in settings] == [layout.micro_batch_size, layout.gradient_accumulation_steps,
                                                     plan.gradient_checkpointing]
        if torchtune_backend.recipe_name(train, hardware).endswith("_distributed"):
            assert config["fsdp_reshard_after_forward"] is torchtune_backend.RESHARD_AFTER_FORWARD[layout.strategy]
        files.append(tmp_path / f"torchtune-{index}.yaml")
        files[-1].write_text(yaml.safe_dump(config))
    python = torchtune_backend.backend_python("torchtune", "torchtune")
    run_command([python, "-c", VALIDATE, *map(str, files)], env={"PYTHONPATH": BACKEND_SIDE_PATH})


def test_run_launches_the_distributed_recipe_and_says_what_ddp_becomes(tiny_model, packed_prepared, tmp_path,
                                                                       monkeypatch, caplog):
    """`run` on two GPUs: `tune validate`, then `tune run` with torchrun's options, and the plan's ddp layout said
    in the log as FSDP2 without resharding (the fake launch leaves a NaN loss, so the run stops there)."""
    from xtrain.plan import make_plan

    train = Train(backend="torchtune", global_batch_size=4, max_steps=2, report_to=[])
    two_gpus = Hardware(accelerator="cuda", gpus=2)
    plan = make_plan(tiny_model, read_json(packed_prepared / "manifest.json"), train, two_gpus)
    assert plan.layout.strategy == "ddp"
    job = TrainJob(tiny_model, packed_prepared, plan, train, two_gpus, tmp_path / "out", tmp_path / "runs", None)
    commands = fake_tune_run(monkeypatch, tmp_path, "Step 1 | loss:nan lr:0.0002\n")
    monkeypatch.setattr(torchtune_backend, "found_device", lambda hardware: hardware.accelerator)  # two GPUs here
    with caplog.at_level("INFO"), pytest.raises(XtrainError, match="NaN or infinite by step 1"):
        get_backend("torchtune").run(job)
    assert [command[3] for command in commands] == ["validate", "run"]
    assert commands[1][4:7] == ["--nproc-per-node=2", "--standalone", "lora_finetune_distributed"]
    assert yaml.safe_load((tmp_path / "runs" / "torchtune.yaml").read_text())["fsdp_reshard_after_forward"] is False
    assert "plan layout ddp -> torchtune FSDP2 with fsdp_reshard_after_forward: False" in caplog.text


# Llama 3.1's rope_scaling as its config.json ships it.
LLAMA_3_1_ROPE = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}


@pytest.mark.slow
def test_llama_3_1_rope_scaling_gives_torchtune_the_frequencies_transformers_uses(torchtune_env, tmp_path):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = {"model_type": "llama", "rope_scaling": LLAMA_3_1_ROPE, "rope_theta": 500000.0}
    factor = torchtune_backend.rope_scale_factor(tmp_path, config)
    assert factor == 8.0
    hf_config = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072,
                            rope_scaling={**LLAMA_3_1_ROPE, "rope_theta": 500000.0})
    inverse, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    script = ("import json, sys\nfrom torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE\n"
              "rope = Llama3ScaledRoPE(dim=128, max_seq_len=16, base=500000.0, scale_factor=float(sys.argv[1]))\n"
              "print(json.dumps(rope.theta.tolist()))")
    python = torchtune_backend.backend_python("torchtune", "torchtune")
    printed = subprocess.run([python, "-c", script, str(factor)], capture_output=True, text=True, check=True).stdout
    theta = json.loads(printed.strip().splitlines()[-1])
    assert torch.tensor(theta) == pytest.approx(inverse, rel=1e-6)


def test_rope_scaling_torchtune_cannot_build_is_refused_by_name(tmp_path):
    for scaling in ({**LLAMA_3_1_ROPE, "low_freq_factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}):
        with pytest.raises(XtrainError, match=r"rope scaling .* is not mapped by the torchtune backend.*trl_local"):
            torchtune_backend.rope_scale_factor(tmp_path, {"rope_scaling": scaling})
    assert torchtune_backend.rope_scale_factor(tmp_path, {"rope_parameters": {"rope_type": "default"}}) == 1
