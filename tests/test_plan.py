"""The plan stage: parameter counts against the real model, batch layout, memory fitting, precision, time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from xtrain.errors import XtrainError
from xtrain.plan import make_plan
from xtrain.plan.model import count_parameters
from xtrain.plan.planner import ALLOCATOR_SLACK, GPU_CONTEXT_BYTES
from xtrain.recipe import Hardware, Train

ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model


def manifest(rows: int = 100, mean_len: int = 50, seq_len: int = 128) -> dict:
    """A manifest in the shape `xtrain.data.prepare` writes."""
    return {
        "sources": {"data/demo/chat.jsonl": {"kept": rows + 10, "dropped": {"duplicate": 1}}},
        "seq_len": seq_len,
        "splits": {
            "train": {
                "rows": rows,
                "tokens": rows * mean_len,
                "supervised_tokens": rows * mean_len // 3,
                "max_len": seq_len,
            },
            "eval": {"rows": 10, "tokens": 10 * mean_len, "supervised_tokens": 10 * mean_len // 3, "max_len": seq_len},
        },
        "fingerprint": "0" * 64,
    }


def load_real_model(model_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


# --- parameter counts -------------------------------------------------------------------------------


def test_full_parameter_count_matches_the_real_model(model_dir):
    model = load_real_model(model_dir)
    real = sum(p.numel() for p in model.parameters())
    counted = count_parameters(model_dir, Train(method="full"))
    assert counted["total"] == counted["trainable"] == real
    assert counted["layers"] == model.config.num_hidden_layers
    assert counted["hidden_size"] == model.config.hidden_size
    assert counted["vocab_size"] == model.config.vocab_size


@pytest.mark.parametrize(
    "lora",
    [
        {},
        {"r": 4, "alpha": 8, "target_modules": ALL_PROJ},
        pytest.param(
            {"r": 8, "target_modules": ["all-linear"]},
            id="all-linear",
        ),
    ],
    ids=["defaults", "all-proj-r4", "all-linear"],
)
def test_lora_parameter_count_matches_peft_on_the_real_model(model_dir, lora):
    from peft import LoraConfig, get_peft_model

    train = Train(method="lora", lora=lora)
    targets = list(train.lora.target_modules)
    # peft's own spelling of "every linear layer but the output head" is the bare string.
    peft_targets = "all-linear" if targets == ["all-linear"] else targets
    peft_model = get_peft_model(
        load_real_model(model_dir),
        LoraConfig(r=train.lora.r, lora_alpha=train.lora.alpha, target_modules=peft_targets),
    )
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    counted = count_parameters(model_dir, train)
    assert counted["trainable"] == trainable
    assert counted["total"] == total
    assert 0 < counted["trainable"] < counted["total"]


@pytest.mark.parametrize(
    "targets",
    [
        pytest.param(["qproj"], id="only-target"),
        pytest.param(["c_attn", "attn.c_proj"], id="all-targets"),
        pytest.param(
            ["q_proj", "v_prj"],
            id="one-of-several",
        ),
    ],
)
def test_lora_target_that_matches_no_module_is_an_error(model_dir, targets):
    train = Train(method="lora", lora={"target_modules": targets})
    with pytest.raises(XtrainError) as info:
        count_parameters(model_dir, train)
    assert "train.lora.target_modules" in str(info.value)


def test_make_plan_reports_the_parameter_counts(model_dir):
    plan = make_plan(model_dir, manifest(), Train(method="full"), Hardware())
    assert plan.model.model_dump(exclude_none=True) == count_parameters(model_dir, Train(method="full"))


# --- batch layout -----------------------------------------------------------------------------------

LAYOUTS = [
    (8, None, {"accelerator": "cpu", "gpus": 0}),
    (8, 2, {"accelerator": "cpu", "gpus": 0}),
    (12, 3, {"accelerator": "cpu", "gpus": 0}),
    (16, None, {"accelerator": "cuda", "gpus": 1}),
    (32, 2, {"accelerator": "cuda", "gpus": 4}),
    (48, None, {"accelerator": "cuda", "gpus": 2, "nodes": 3}),
    (64, 1, {"accelerator": "rocm", "gpus": 8, "nodes": 2}),
]


@pytest.mark.parametrize(("global_batch", "micro", "hardware"), LAYOUTS)
def test_micro_batch_times_accumulation_times_devices_is_the_global_batch(model_dir, global_batch, micro, hardware):
    train = Train(global_batch_size=global_batch, micro_batch_size=micro)
    hw = Hardware(**hardware)
    layout = make_plan(model_dir, manifest(), train, hw).layout
    assert layout.micro_batch_size * layout.gradient_accumulation_steps * layout.devices == global_batch
    assert layout.devices == hw.devices
    assert layout.global_batch_size == global_batch
    assert layout.strategy == ("single" if hw.devices == 1 else "ddp")
    if micro:
        assert layout.micro_batch_size == micro


@pytest.mark.parametrize(
    ("global_batch", "micro", "hardware"),
    [(8, 3, {}), (8, 16, {}), (16, 3, {"accelerator": "cuda", "gpus": 2})],
)
def test_micro_batch_that_does_not_divide_the_per_device_batch_is_an_error(model_dir, global_batch, micro, hardware):
    train = Train(global_batch_size=global_batch, micro_batch_size=micro)
    with pytest.raises(XtrainError) as info:
        make_plan(model_dir, manifest(), train, Hardware(**hardware))
    assert "train.micro_batch_size" in str(info.value)
    assert "divisor" in str(info.value)


# --- memory -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["lora", "full"])
def test_a_small_gpu_gets_checkpointing_or_a_smaller_micro_batch(model_dir, method):
    train = Train(method=method, global_batch_size=8)
    roomy = make_plan(model_dir, manifest(), train, Hardware(accelerator="cuda", gpus=1))
    assert roomy.layout.micro_batch_size == 8
    assert roomy.gradient_checkpointing is False
    need = roomy.memory.peak_bytes_per_device

    # A GPU with room for 60% of the tensors the unconstrained layout needs, besides the runtime's own.
    memory = GPU_CONTEXT_BYTES + ALLOCATOR_SLACK * 0.6 * need
    small = Hardware(accelerator="cuda", gpus=1, gpu_memory_gb=memory / 2**30)
    plan = make_plan(model_dir, manifest(), train, small)
    assert plan.gradient_checkpointing or plan.layout.micro_batch_size < 8
    assert plan.memory.peak_bytes_per_device <= 0.6 * need
    assert plan.memory.reserved_bytes_per_device <= plan.memory.budget_bytes_per_device
    layout = plan.layout
    assert layout.micro_batch_size * layout.gradient_accumulation_steps == 8
    assert plan.memory.peak_bytes_per_device == sum(plan.memory.breakdown_bytes.values())


def test_a_run_that_fits_nowhere_says_no_single_change_fits(model_dir):
    tiny_host = Hardware(accelerator="cpu", host_memory_gb=0.7)  # all of it the process's own
    with pytest.raises(XtrainError) as info:
        make_plan(model_dir, manifest(), Train(method="full"), tiny_host)
    message = str(info.value)
    assert "does not fit" in message and "host RAM" in message
    assert "No single change fits" in message
    assert "data.seq_len" in message
    assert "lora" in message
    assert "hardware.gpus" in message


def test_lora_needs_less_memory_than_full(model_dir):
    hw = Hardware(accelerator="cuda", gpus=1)
    lora = make_plan(model_dir, manifest(), Train(method="lora"), hw).memory
    full = make_plan(model_dir, manifest(), Train(method="full"), hw).memory
    assert lora.breakdown_bytes["optimizer"] < full.breakdown_bytes["optimizer"]
    assert lora.peak_bytes_per_device < full.peak_bytes_per_device


# --- precision, resources, time ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "method", "precision", "weights"),
    [
        ({"accelerator": "cuda", "gpus": 1}, "lora", "bf16", "bf16"),
        ({"accelerator": "cuda", "gpus": 1}, "full", "bf16", "fp32"),
        ({"accelerator": "cuda", "gpus": 8, "nodes": 2}, "lora", "bf16", "bf16"),
        ({"accelerator": "cuda", "gpus": 1, "gpu_model": "v100"}, "lora", "fp16", "fp16"),
        ({"accelerator": "rocm", "gpus": 1}, "full", "bf16", "fp32"),
    ],
)
def test_gpu_precision_is_bf16_where_supported_else_fp16(model_dir, hardware, method, precision, weights):
    plan = make_plan(model_dir, manifest(), Train(backend="trl_local", method=method, global_batch_size=16), Hardware(**hardware))
    assert (plan.precision, plan.weights_dtype) == (precision, weights)


def test_cpu_precision_is_the_faster_predicted_one(model_dir, monkeypatch):
    import xtrain.plan.planner as plan_module

    monkeypatch.setattr(plan_module, "cpu_supports_bf16", lambda: False)
    assert make_plan(model_dir, manifest(), Train(), Hardware()).precision == "fp32"
    monkeypatch.setattr(plan_module, "cpu_supports_bf16", lambda: True)
    chosen = make_plan(model_dir, manifest(), Train(), Hardware())
    seconds = {}
    for precision in ("fp32", "bf16"):
        monkeypatch.setattr(plan_module, "precisions", lambda hardware, backend, p=precision: [p])
        seconds[precision] = make_plan(model_dir, manifest(), Train(), Hardware()).time.seconds_per_step
    assert chosen.precision == min(seconds, key=seconds.get)
    assert chosen.weights_dtype == "fp32"


@pytest.mark.parametrize(
    "hardware", [{"accelerator": "cpu", "gpus": 0}, {"accelerator": "cuda", "gpus": 2, "nodes": 2}]
)
def test_resources_are_positive_and_match_the_hardware(model_dir, hardware):
    hw = Hardware(**hardware)
    plan = make_plan(model_dir, manifest(), Train(global_batch_size=8), hw)
    resources = plan.resources
    assert isinstance(resources.mem_mb, int) and resources.mem_mb > 0
    assert isinstance(resources.runtime, int) and resources.runtime > 0
    assert resources.gpus == hw.gpus
    assert resources.nodes == hw.nodes
    assert plan.time.seconds >= 0


def test_plan_carries_the_data_summary(model_dir):
    m = manifest(rows=100, mean_len=50, seq_len=128)
    plan = make_plan(model_dir, m, Train(), Hardware())
    assert plan.data.model_dump() == {
        "train_rows": 100,
        "train_tokens": 5000,
        "supervised_tokens": 5000 // 3,
        "seq_len": 128,
        "longest_sequence_tokens": 128,
        "mean_sequence_tokens": 50.0,
        "fingerprint": m["fingerprint"],
    }
    assert plan.time.tokens_per_step == 8 * 50


@pytest.mark.parametrize(
    ("rows", "global_batch", "epochs"),
    [(100, 8, 1), (96, 8, 3), (100, 8, 3), (9, 8, 1), (1000, 16, 0.5), (50, 4, 2.5)],
)
def test_steps_follow_rows_batch_and_epochs(model_dir, rows, global_batch, epochs):
    plan = make_plan(model_dir, manifest(rows=rows), Train(global_batch_size=global_batch, epochs=epochs), Hardware())
    # As the HF Trainer counts them: a partial last batch is a step of every epoch.
    assert plan.time.steps == math.ceil(math.ceil(rows / global_batch) * epochs)
    if rows % global_batch == 0:
        assert plan.time.steps == math.ceil(rows / global_batch * epochs)


def test_max_steps_overrides_epochs(model_dir):
    plan = make_plan(model_dir, manifest(rows=100), Train(global_batch_size=8, epochs=3, max_steps=7), Hardware())
    assert plan.time.steps == 7


def test_more_steps_predict_more_time(model_dir):
    short = make_plan(model_dir, manifest(rows=100), Train(max_steps=10), Hardware())
    long = make_plan(model_dir, manifest(rows=100), Train(max_steps=100), Hardware())
    assert long.time.seconds > short.time.seconds
    assert long.resources.runtime >= short.resources.runtime


def test_cpu_processes_share_the_node_memory_and_cores(model_dir):
    one = make_plan(model_dir, manifest(), Train(global_batch_size=8), Hardware(host_memory_gb=16, cpus=2))
    two = make_plan(model_dir, manifest(), Train(global_batch_size=8), Hardware(host_memory_gb=16, cpus=2, processes=2))
    assert (two.layout.strategy, two.layout.devices) == ("ddp", 2)
    assert two.layout.micro_batch_size * two.layout.gradient_accumulation_steps == 4
    gib = 2**30
    assert one.memory.budget_bytes_per_device == int(16 * gib * 0.9) - 680 * 2**20
    assert two.memory.budget_bytes_per_device == int(16 * gib * 0.9) // 2 - 680 * 2**20
    assert "(1 threads" in two.time.throughput_source and "(2 threads" in one.time.throughput_source
    assert two.resources.mem_mb > one.resources.mem_mb, "two processes, each with its own overhead"


def test_a_plan_is_validated_when_written_and_read(tmp_path):
    from conftest import SAMPLE_PLAN, sample_plan

    from xtrain.artifacts import write_json
    from xtrain.plan import read_plan, write_plan

    write_plan(tmp_path / "plan.json", sample_plan())
    assert read_plan(tmp_path / "plan.json") == sample_plan()
    write_json(tmp_path / "old.json", {**SAMPLE_PLAN, "layout": {"micro_batch_size": 8}})
    with pytest.raises(XtrainError, match=r"old.json: not a plan .*layout.strategy: Field required.*rerun the plan"):
        read_plan(tmp_path / "old.json")


def test_the_host_memory_request_allows_for_what_the_train_jobs_allocator_keeps(model_dir, monkeypatch):
    """glibc keeps what each batch shape frees (the showcase's peak: 1.75x the prediction); TCMalloc and jemalloc,
    which the train job runs under when the machine has them, give it back; the lock's mimalloc keeps a fixed amount
    more (on a small model its request is above TCMalloc's)."""
    from xtrain.plan import planner as planning

    requests = {}
    for name in ("glibc", "tcmalloc", "mimalloc"):
        monkeypatch.setattr(planning.allocator, "for_train_job", lambda name=name: name)
        made = make_plan(model_dir, manifest(), Train(global_batch_size=8), Hardware(host_memory_gb=16, cpus=2))
        assert made.resources.allocator == name
        requests[name] = made.resources.mem_mb
        kept = planning.HOST_RETENTION[name]
        host = planning.CPU_PROCESS_BYTES + kept.fixed_bytes + made.memory.peak_bytes_per_device * kept.step_factor
        assert made.resources.mem_mb == math.ceil(int(host) * 1.25 / 2**20)
    assert requests["glibc"] > requests["tcmalloc"] and requests["mimalloc"] > requests["tcmalloc"]


@pytest.mark.parametrize("change, reason", [
    ({"backend_compiles": False}, "train.backend axolotl does not compile"),
    ({"objective": "dpo"}, "compiled preference steps are not measured"),
    ({"device": "cuda"}, "speed-up on cuda in bf16 is not measured"),
    ({"memory_allocator": "jemalloc"}, "speed-up on cpu in bf16 under jemalloc is not measured"),
    ({"precision": "fp32"}, "measured 0.92x: slower than eager"),
    ({"micro_steps": 10}, "not more than the 28 s compile"),
    ({"memory_allocator": "tcmalloc", "micro_steps": 200}, "the 1.10x step would save 27 s over 200 micro-steps"),
    ({"mean_len": 20.0}, "would save -"),
    ({"ops": 0}, "its compile time is unknown"),
])
def test_compile_is_ruled_out_with_the_reason(change, reason):
    from xtrain.plan.compile import decide

    settings = {"device": "cpu", "precision": "bf16", "memory_allocator": "glibc", "objective": "sft", "backend": "axolotl",
                "backend_compiles": True,
                "micro_steps": 1000, "micro_seconds": 2.0, "ops": 7051, "shapes": 8, "mean_len": 300.0}
    assert decide(**settings).mode == "default"
    eager = decide(**{**settings, **change})
    assert eager.mode is None and eager.warmup_seconds == 0 and eager.pad_to_multiple_of is None
    assert eager.reason.startswith("eager: ") and reason in eager.reason


def test_compile_pays_only_when_the_steps_repay_the_warmup():
    """Warm-up: 2 ms per op per compile, two compiles when batch lengths vary (one when every row is one length,
    which then needs no bucket); the saving: (1 - padding / speed-up) of the eager micro-steps."""
    from xtrain.plan.compile import batch_shapes, decide, padding

    assert batch_shapes(512, 512.0) == 1 and batch_shapes(512, 300.0) == 32 and batch_shapes(100, 60.0) == 7
    fixed = decide("cpu", "bf16", "glibc", "sft", "trl_cpu", True, 1000, 2.0, 7051, 1, 512.0)
    assert fixed.mode == "default" and fixed.pad_to_multiple_of is None
    assert fixed.warmup_seconds == pytest.approx(0.002 * 7051, abs=0.1)
    varied = decide("cpu", "bf16", "glibc", "sft", "trl_cpu", True, 1000, 2.0, 7051, 32, 300.0)
    assert varied.pad_to_multiple_of == 16 and varied.warmup_seconds == pytest.approx(2 * 0.002 * 7051, abs=0.1)
    # Just below and just above the break-even number of micro-steps.
    per_step = 2.0 * (1 - padding(32, 300.0) / 1.20)  # glibc's measured speed-up
    break_even = varied.warmup_seconds / per_step
    assert decide("cpu", "bf16", "glibc", "sft", "trl_cpu", True, int(break_even), 2.0, 7051, 32, 300.0).mode is None
    assert decide("cpu", "bf16", "glibc", "sft", "trl_cpu", True, int(break_even) + 2, 2.0, 7051, 32, 300.0).mode == "default"
    # Rows so short that half a bucket of padding costs more than compiling gains.
    assert "would save -" in decide("cpu", "bf16", "glibc", "sft", "trl_cpu", True, 1000, 2.0, 7051, 32, 30.0).reason


def test_a_long_bf16_run_on_the_cpu_is_planned_compiled(model_dir, monkeypatch):
    """The plan compiles where it pays on a backend that compiles: its time holds the faster steps and the warm-up,
    its memory the batches padded to the bucket; a backend that does not compile is planned eager, saying so."""
    import xtrain.plan.planner as plan_module
    from xtrain.plan import compile as compilation

    monkeypatch.setattr(plan_module, "cpu_supports_bf16", lambda: True)
    monkeypatch.setattr(plan_module, "precisions", lambda hardware, backend: ["bf16"])
    monkeypatch.setattr(plan_module.allocator, "for_train_job", lambda: "glibc")
    monkeypatch.setattr(compilation, "SECONDS_PER_OP", 1e-5)  # the tiny model's step: make compiling pay
    data = manifest(rows=4000, mean_len=90, seq_len=100)
    compiled = make_plan(model_dir, data, Train(global_batch_size=8), Hardware())
    assert compiled.compile.mode == "default" and compiled.compile.pad_to_multiple_of == 16
    assert compiled.compile.batch_shapes == 7
    eager = make_plan(model_dir, data, Train(global_batch_size=8, backend="axolotl"), Hardware())
    assert eager.compile.mode is None and "axolotl does not compile" in eager.compile.reason
    ratio = (1 + 8 / 90) / 1.20  # half a bucket of padding per row, at the measured speed-up
    assert compiled.time.seconds_per_step == pytest.approx(eager.time.seconds_per_step * ratio, rel=5e-3)
    assert compiled.time.seconds == pytest.approx(
        compiled.time.steps * compiled.time.seconds_per_step + compiled.compile.warmup_seconds, abs=0.2)
    assert compiled.memory.peak_bytes_per_device > eager.memory.peak_bytes_per_device  # rows padded 100 -> 112


def test_the_trace_counts_attention_and_a_packed_micro_batch_attends_across_its_rows(model_dir):
    """Per-token FLOPs grow with the length attention spans (the CPU's fused attention is counted, causal half); a
    packed micro-batch trains as one sequence of rows x seq_len tokens under a block mask, every block computed."""
    from xtrain.plan.memory import Step, traced

    def per_token(rows: int, seq_len: int, packed: bool) -> float:
        return traced(model_dir, Train(), Step(rows, seq_len, "fp32", "fp32", False, packed=packed)).flops / (
            rows * seq_len)

    short, long = per_token(4, 64, False), per_token(4, 128, False)
    assert long > short
    attention_per_length = (long - short) / 64  # causal: half of 4·hidden·length per layer, forward and backward
    packed = per_token(4, 64, True)
    assert packed > per_token(1, 256, False)  # a block mask computes every block; causal skips half
    assert packed == pytest.approx(short + attention_per_length * (2 * 256 - 64), rel=0.05)


def test_with_gradient_accumulation_the_trace_holds_the_summed_gradients_as_a_real_loop_does(model_dir):
    """Every micro-step after an optimizer step's first runs with the gradients summed so far held: a full fine-tune's
    are as large as its weights. The plan traces such a micro-step; its peak is a real accumulating loop's (torch's
    MemTracker on real tensors, two optimizer steps of four micro-steps), where one micro-step alone falls short."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from xtrain.plan.memory import Step, traced

    train = Train(method="full", global_batch_size=8, micro_batch_size=2)
    plan = make_plan(model_dir, manifest(), train, Hardware())
    assert plan.layout.gradient_accumulation_steps == 4
    gradients = plan.model.total * 4
    assert plan.memory.breakdown_bytes["gradients"] >= gradients

    model = load_real_model(model_dir).train()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    ids = torch.zeros((2, 128), dtype=torch.long)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for _ in range(2):
            for _ in range(4):
                model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
                tracker.reset_mod_stats()  # the tracker's per-module figures, which it keeps for one pass only
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    real = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    def peak(accumulating: bool) -> int:
        step = Step(2, 128, "fp32", "fp32", False, accumulating=accumulating)
        return sum(traced(model_dir, train, step).breakdown.values())

    assert peak(True) == pytest.approx(real, rel=0.02)  # equal on this model (12,448,440 bytes)
    assert peak(False) < real - gradients // 2


def test_an_fsdp_step_peaks_where_its_sharded_phases_do_activations_included(model_dir):
    """Unsharded, a full fine-tune's step on short rows peaks at the end of its backward (weights, gradients, two
    states, no activations left); FSDP shards those across the GPUs but not the activations, so its peak is the
    largest phase once sharded: it holds the forward's activations on top of its shards."""
    from xtrain.plan.memory import Step, traced
    from xtrain.plan.planner import Planner

    train = Train(method="full", global_batch_size=8, micro_batch_size=1)
    hardware = Hardware(accelerator="cuda", gpus=8, gpu_model="h100")
    planner = Planner(model_dir, train, hardware, count_parameters(model_dir, train), per_device=1)
    step = Step(1, 16, "bf16", "fp32", False)  # short rows: few activations beside the states
    phases = traced(model_dir, train, step).phases
    unsharded = max(phases, key=lambda phase: sum(phase.values()))
    most_activations = max(phase["activations"] for phase in phases)
    assert unsharded["activations"] < most_activations / 2  # the unsharded peak is after the activations are freed
    sharded = planner.training_breakdown(step, "fsdp")
    assert sum(sharded.values()) >= most_activations + unsharded["weights"] // 8
    assert sum(sharded.values()) < sum(unsharded.values())


def test_a_packed_run_gets_the_predicted_fastest_micro_batch(model_dir):
    """At seq_len 1024 the tiny model's attention over a packed micro-batch outweighs its small matmuls: the largest
    micro-batch that fits is the slowest, and the plan takes the predicted-fastest instead."""
    from xtrain.plan.model import count_parameters
    from xtrain.plan.planner import Planner, first_step

    data = {**manifest(rows=400, mean_len=1024, seq_len=1024), "packing": True}
    train = Train(global_batch_size=8)
    plan = make_plan(model_dir, data, train, Hardware())
    planner = Planner(model_dir, train, Hardware(), count_parameters(model_dir, train), packed=True)

    def seconds(micro: int) -> float:
        step = first_step(planner, plan.precision, micro, 1024, False)
        return planner.seconds_per_micro_step(step, step.rows * 1024)[0] * (8 // micro)

    assert seconds(8) > seconds(1)
    assert plan.layout.micro_batch_size == min((1, 2, 4, 8), key=seconds)
