"""trl_local: the device and process checks, the launch commands it builds, and real training on this CPU
in one and in two processes (DDP over gloo) against the trl_cpu reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_contract import assert_checkpoint_contract
from conftest import build_run, sample_plan

from xtrain.errors import XtrainError
from xtrain.plan import read_plan
from xtrain.recipe import Hardware, RecipeError, Train, parse_recipe
from xtrain.train.backends import registry as backends
from xtrain.train.backends.contract import TrainJob
from xtrain.train.backends.distributed import first_host, found_device, torchrun_command
from xtrain.train.backends.trl import cpu_placement
from xtrain.train.backends.trl_local import TrlLocal

SLURM = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_one_node_launches_a_standalone_torchrun_with_one_worker_per_process():
    command = torchrun_command("/env/bin/python", Hardware(processes=2), TrlLocal.worker(Path("/runs/job.json")), {})
    assert command == [
        "/env/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
        "-m", "xtrain.train.backends.trl_local", "/runs/job.json",
    ]


def test_several_nodes_launch_one_torchrun_per_node_under_srun_with_the_slurm_rendezvous():
    hardware = Hardware(accelerator="cuda", gpus=4, nodes=2)
    worker = TrlLocal.worker(Path("/runs/job.json"))
    command = torchrun_command("/env/bin/python", hardware, worker, {**SLURM, "MASTER_PORT": "29611"})
    assert command == [
        "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--overlap", "--kill-on-bad-exit=1",
        "/env/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=4",
        "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=gpu07:29611", "--rdzv-id=4242",
        "-m", "xtrain.train.backends.trl_local", "/runs/job.json",
    ]


@pytest.mark.parametrize(("nodelist", "host"), [
    ("gpu[07-08]", "gpu07"), ("node3", "node3"), ("a1,b2", "a1"), ("rack1-n[010,012-014],x9", "rack1-n010"),
])
def test_the_rendezvous_host_is_the_first_of_the_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_several_nodes_need_a_slurm_allocation_of_that_many_nodes():
    hardware = Hardware(accelerator="cuda", gpus=8, nodes=2)
    with pytest.raises(XtrainError, match="from inside a Slurm allocation of 2 nodes"):
        torchrun_command("python", hardware, TrlLocal.worker(Path("job.json")), {})
    with pytest.raises(XtrainError, match="hardware.nodes is 2 but Slurm job 4242 has 3 node"):
        torchrun_command("python", hardware, TrlLocal.worker(Path("job.json")), {**SLURM, "SLURM_JOB_NUM_NODES": "3"})


def test_a_plan_the_cpu_cannot_run_is_refused_before_launch():
    with pytest.raises(XtrainError, match="CPU processes train as DDP only"):
        cpu_placement(sample_plan(precision="fp32", layout={"strategy": "fsdp"}))
    with pytest.raises(XtrainError, match="plan precision 'fp16' cannot run on the CPU"):
        cpu_placement(sample_plan(precision="fp16", layout={"strategy": "single"}))


def test_a_gpu_recipe_on_a_machine_without_one_says_so():
    # This machine's torch is the CPU build: no GPU is ever visible.
    with pytest.raises(XtrainError, match=r"hardware.accelerator is 'cuda' but torch .* sees no GPU here"):
        found_device(Hardware(accelerator="cuda", gpus=1))
    assert found_device(Hardware()) == "cpu"


def test_cpu_processes_are_checked_where_they_cannot_be_honoured():
    recipe = {"model": {"path": "m"}, "data": {"sources": [{"path": "d.jsonl"}]},
              "hardware": {"accelerator": "cuda", "gpus": 2, "processes": 2}}
    with pytest.raises(RecipeError, match="processes is 2 but accelerator is `cuda`"):
        parse_recipe(recipe, "recipes/r.yaml")
    with pytest.raises(XtrainError, match="trl_cpu runs 1 CPU process"):
        backends.check("trl_cpu", Train(), Hardware(processes=2))
    with pytest.raises(XtrainError, match="trl_local runs CPU training on one node"):
        backends.check("trl_local", Train(backend="trl_local"), Hardware(nodes=2))


@pytest.mark.slow
def test_a_recipe_asking_for_a_gpu_stops_before_training_and_leaves_no_checkpoint(tiny_model, tmp_path):
    with pytest.raises(XtrainError, match="sees no GPU here"):
        build_run(tmp_path, tiny_model, Train(backend="trl_local", max_steps=1), Hardware(accelerator="cuda", gpus=1))
    assert not (tmp_path / "checkpoint").exists()


# Real training. Dropout off: each process would draw its own dropout masks. A fixed micro-batch of 3 gives
# one process 2 micro-batches per step and each of two processes 1: the same six rows per step, the same
# micro-batches (so the same padding), and the loss of a step is the mean over the step's supervised tokens
# in both (the trainer counts them over all micro-batches and processes; the logged loss is averaged over
# processes). Length grouping is done per global step (backends/trl.py), so the order is the same too; with
# transformers' per-process grouping it is not: over the demo's 352 train rows it sorts windows of 84 rows
# for one process and 87 for two, and steps 2-5 then differ by up to 0.015 (checked by disabling the override).
def recipe_train(backend: str) -> Train:
    return Train(backend=backend, global_batch_size=6, micro_batch_size=3, max_steps=5, learning_rate=5e-3,
                 logging_steps=1, lora={"dropout": 0.0})


def losses(checkpoint: Path) -> list[float]:
    return [entry["loss"] for entry in json.loads((checkpoint / "train_metrics.json").read_text())["loss"]]


@pytest.fixture(scope="module")
def trl_cpu_run(tiny_model, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("trl_cpu"), tiny_model, recipe_train("trl_cpu"))


@pytest.fixture(scope="module")
def one_process_run(tiny_model, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("one"), tiny_model, recipe_train("trl_local"))


@pytest.mark.slow
def test_one_process_on_the_cpu_meets_the_contract_and_starts_at_trl_cpus_loss(one_process_run, trl_cpu_run,
                                                                                tiny_model):
    metrics = assert_checkpoint_contract(one_process_run["checkpoint"], tiny_model, "trl_local")
    assert metrics["steps"] == 5
    plan = read_plan(one_process_run["plan"]).layout
    assert (plan.strategy, plan.micro_batch_size, plan.gradient_accumulation_steps) == ("single", 3, 2)
    # The same trainer on the same rows: the whole curve agrees, the brief's 2% on the first step a fortiori.
    assert losses(one_process_run["checkpoint"])[0] == pytest.approx(losses(trl_cpu_run["checkpoint"])[0], rel=0.02)
    assert losses(one_process_run["checkpoint"]) == pytest.approx(losses(trl_cpu_run["checkpoint"]), abs=1e-6)


@pytest.mark.slow
def test_two_processes_give_the_one_process_loss_curve(one_process_run, tiny_model, tmp_path, caplog):
    caplog.set_level("INFO", logger="xtrain.stage")
    two = build_run(tmp_path, tiny_model, recipe_train("trl_local"), Hardware(processes=2))
    plan = read_plan(two["plan"]).layout
    assert (plan.strategy, plan.devices, plan.micro_batch_size, plan.gradient_accumulation_steps) == (
        "ddp", 2, 3, 1)
    launched = [r.getMessage() for r in caplog.records]
    assert any("torch.distributed.run --nproc-per-node=2" in message for message in launched)
    assert sum("2 process(es), model wrapped as DistributedDataParallel" in message for message in launched) == 2
    metrics = assert_checkpoint_contract(two["checkpoint"], tiny_model, "trl_local")
    one = json.loads((one_process_run["checkpoint"] / "train_metrics.json").read_text())
    assert [e["step"] for e in metrics["loss"]] == [e["step"] for e in one["loss"]] == [1, 2, 3, 4, 5]
    assert losses(two["checkpoint"]) == pytest.approx(losses(one_process_run["checkpoint"]), abs=1e-3)
    assert metrics["tokens_seen"] == one["tokens_seen"], "every process's tokens are counted once"


@pytest.mark.slow
def test_trls_config_accepts_the_8_gpu_fsdp_settings_and_refuses_bf16_where_the_gpu_has_none(tiny_model, prepared,
                                                                                                tmp_path):
    """The lane's validation (the smoke stage's launch step): TRL's config class builds the 8-H100 FSDP settings as
    an H100 node would (its bf16 probe answering the H100's), and refuses the same bf16 settings for V100s with
    transformers' own message."""
    layout = {"strategy": "fsdp", "devices": 8, "nodes": 1, "micro_batch_size": 2, "gradient_accumulation_steps": 1,
              "global_batch_size": 16}
    train = Train(backend="trl_local", method="full", lora=None, global_batch_size=16, max_steps=4, report_to=[])
    plan = sample_plan(precision="bf16", gradient_checkpointing=True, layout=layout)
    backend = TrlLocal()

    def validate(gpu: str) -> dict:
        job = TrainJob(tiny_model, prepared, plan, train, Hardware(accelerator="cuda", gpus=8, gpu_model=gpu),
                       tmp_path / "out", tmp_path / "work", None)
        return backend.validate(job, backend.native(job), tmp_path / gpu)

    read_back = validate("h100")["read_back"]
    assert (read_back["config_class"], read_back["bf16"], read_back["fsdp"]) == ("SFTConfig", True, True)
    assert read_back["fsdp_config"]["activation_checkpointing"] is True
    assert read_back["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    with pytest.raises(XtrainError, match="Your setup doesn't support bf16/gpu"):
        validate("v100")
