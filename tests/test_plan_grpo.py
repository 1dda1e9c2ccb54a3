"""The plan of a GRPO recipe: its generation phase (KV cache, sampling, reference model as TRL holds it, time), and
the device's peak as the larger of that phase and the training step on prompt + completion rows."""

from __future__ import annotations

import pytest

from xtrain.plan import make_plan
from xtrain.plan.generation import (CPU_SAMPLING_SECONDS_PER_LOGIT, GENERATE_LOOP_OPS, GRPO_STEP_OPS,
                                    NO_GRAD_OP_SHARE, ForwardTrace, Sampling, generation_seconds)
from xtrain.plan.speed import device_rates
from xtrain.recipe import Hardware, Train

# The tiny model: 2 layers, 2 key-value heads of 24 dimensions, weights in fp32 on the CPU.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 24 * 4
PROMPT, SEQ_LEN = 30, 128
MANIFEST = {"data_kind": "prompts", "seq_len": SEQ_LEN, "packing": False, "fingerprint": "f",
            "splits": {"train": {"rows": 200, "sequences_per_row": 1, "tokens": 200 * 20, "supervised_tokens": 0,
                                 "max_len": PROMPT}}}
REWARDS = [{"type": "format", "pattern": "^A"}]


def grpo(**changes) -> Train:
    rl = {"generations": 4, "max_completion_length": 8, **changes.pop("rl", {})}
    return Train.model_validate({"objective": "grpo", "method": "lora", "global_batch_size": 16, "max_steps": 10,
                                 "rewards": REWARDS, "rl": rl, **changes})


def plan_of(tiny_model, train: Train, **hardware):
    return make_plan(tiny_model, MANIFEST, train, Hardware(**hardware))


def test_the_generation_phase_holds_the_kv_cache_of_every_completion_at_full_length(tiny_model):
    plan = plan_of(tiny_model, grpo(micro_batch_size=4))
    phase = plan.generation
    # steps_per_generation defaults to the accumulation: one generation per optimizer step, of the whole device batch
    assert (phase.completions_per_device, phase.prompts_per_device, phase.generations_per_step) == (16, 4, 1.0)
    assert (phase.prompt_tokens, phase.completion_tokens) == (PROMPT, 8)
    assert phase.kv_cache_bytes == 16 * (PROMPT + 8) * KV_BYTES_PER_TOKEN == phase.breakdown_bytes["kv_cache"]
    assert phase.peak_bytes_per_device == sum(phase.breakdown_bytes.values())
    # no gradients while generating at a step's start; the weights and AdamW states stay resident
    training = plan.memory.breakdown_bytes
    assert phase.breakdown_bytes["gradients"] == 0
    assert (phase.breakdown_bytes["weights"], phase.breakdown_bytes["optimizer"]) == (training["weights"],
                                                                                      training["optimizer"])
    # the training step runs on prompt + completion rows
    assert plan.data.longest_sequence_tokens == PROMPT + 8
    assert plan.memory.peak_bytes_per_device == max(phase.peak_bytes_per_device, phase.training_peak_bytes_per_device)
    assert plan.memory.peak_bytes_per_device == sum(plan.memory.breakdown_bytes.values())
    assert phase.ops_per_new_token == phase.ops_per_forward + GENERATE_LOOP_OPS


def test_longer_completions_cost_cache_and_time(tiny_model):
    short, long = (plan_of(tiny_model, grpo(rl={"max_completion_length": n})) for n in (8, 64))
    assert long.generation.kv_cache_bytes == short.generation.kv_cache_bytes * (PROMPT + 64) // (PROMPT + 8)
    # One decode forward per new token: 56 more cost over 4 times the prompt's forward and 8 tokens (GRPOTrainer's
    # bookkeeping is once per batch whatever its length).
    fixed = GRPO_STEP_OPS * short.time.op_seconds
    assert long.generation.seconds - short.generation.seconds > 4 * (short.generation.seconds - fixed)
    assert long.time.seconds_per_step - long.generation.seconds_per_step > (
        short.time.seconds_per_step - short.generation.seconds_per_step)  # and a longer training row


def test_steps_per_generation_sizes_the_generation_batch(tiny_model):
    accumulated = plan_of(tiny_model, grpo(micro_batch_size=4, rl={"steps_per_generation": 2}))
    phase = accumulated.generation
    assert accumulated.layout.gradient_accumulation_steps == 4
    assert (phase.completions_per_device, phase.generations_per_step) == (8, 2.0)
    assert phase.seconds_per_step == pytest.approx(2 * phase.seconds, abs=1e-4)  # both rounded to 4 decimals
    # the second generation falls inside the optimizer step: the first micro-steps' gradients are held
    assert phase.breakdown_bytes["gradients"] == accumulated.model.trainable * 4
    assert not phase.policy_logps_recomputed
    misaligned = plan_of(tiny_model, grpo(micro_batch_size=4, rl={"steps_per_generation": 3}))
    assert misaligned.generation.policy_logps_recomputed  # 4 micro-steps are not a multiple of 3


def test_the_reference_is_the_disabled_adapter_for_lora_and_a_copy_for_a_full_fine_tune(tiny_model):
    lora, lora_kl = (plan_of(tiny_model, grpo(rl={"kl_weight": kl})) for kl in (0.0, 0.05))
    assert (lora.reference, lora_kl.reference) == (None, "adapter")
    assert lora_kl.memory.breakdown_bytes["weights"] == lora.memory.breakdown_bytes["weights"]  # no copy held
    assert lora_kl.time.seconds_per_step > lora.time.seconds_per_step  # its forward over every sequence
    full, full_kl = (plan_of(tiny_model, grpo(method="full", lora=None, rl={"kl_weight": kl})) for kl in (0.0, 0.05))
    assert full_kl.reference == "copy"
    copy = full_kl.model.total * 4
    assert full_kl.generation.breakdown_bytes["weights"] == full.generation.breakdown_bytes["weights"] + copy


def test_a_large_generation_batch_sets_the_peak(tiny_model):
    # One completion trains at a time, while all 16 are sampled at once after their long prompts.
    plan = plan_of(tiny_model, grpo(micro_batch_size=1, rl={"steps_per_generation": 16}))
    phase = plan.generation
    assert phase.completions_per_device == 16 and phase.peak_bytes_per_device > phase.training_peak_bytes_per_device
    assert plan.memory.breakdown_bytes == phase.breakdown_bytes
    assert plan.memory.peak_bytes_per_device == phase.peak_bytes_per_device


def test_an_sft_plan_has_no_generation_phase(tiny_model):
    manifest = {**MANIFEST, "data_kind": "chats",
                "splits": {"train": {**MANIFEST["splits"]["train"], "supervised_tokens": 1000}}}
    plan = make_plan(tiny_model, manifest, Train(global_batch_size=16, max_steps=10), Hardware())
    assert plan.generation is None and "kv_cache" not in plan.memory.breakdown_bytes


def test_generation_time_counts_ops_at_their_no_grad_cost_and_the_trainers_bookkeeping_once_per_batch():
    # An op-bound model (as the tiny one is on a CPU): FLOPs cost next to nothing at this rate.
    trace = ForwardTrace(flops_per_token=0.0, ops=100, weight_bytes=0, kv_bytes_per_token=0, head_flops=0)
    params = {"layers": 2, "hidden_size": 96, "vocab_size": 1024}
    rates = {"matmul_flops": 1e15, "op_seconds": 1e-5, "memory_bytes_per_second": 1e10, "accelerator": "cuda"}
    short, long = (generation_seconds(trace, params, Sampling(16, 20, tokens, 1.0, False), rates) for tokens in (8, 16))
    per_token = (long - short) / 8
    assert per_token == pytest.approx((100 + GENERATE_LOOP_OPS) * 1e-5 * NO_GRAD_OP_SHARE, rel=1e-3)
    assert NO_GRAD_OP_SHARE < 1  # a no-grad op records nothing for autograd: cheaper than a training step's
    # What is left besides the new tokens: the prefill forward's ops and GRPOTrainer's work around the batch, whatever
    # the batch's size.
    fixed = short - 8 * per_token
    assert fixed == pytest.approx(100 * 1e-5 * NO_GRAD_OP_SHARE + GRPO_STEP_OPS * 1e-5, rel=1e-3)
    wide = generation_seconds(trace, params, Sampling(64, 20, 8, 1.0, False), rates)
    assert wide == pytest.approx(short, rel=1e-3)


def test_a_new_token_reads_every_weight_and_the_cache_so_far_from_memory():
    """Decoding a model whose weights do not fit the caches: each new token streams them all (issue 38). A CPU core
    pays the bytes on top of the FLOPs and samples over the vocabulary; a GPU overlaps the two (the slower counts)."""
    trace = ForwardTrace(flops_per_token=2e8, ops=0, weight_bytes=500_000_000, kv_bytes_per_token=1000, head_flops=0)
    params = {"layers": 2, "hidden_size": 96, "vocab_size": 50_000}
    rows, prompt = 16, 20

    def per_token(rates: dict) -> float:
        short, long = (generation_seconds(trace, params, Sampling(rows, prompt, n, 1.0, False), rates) for n in (8, 16))
        return (long - short) / 8

    cpu = {"matmul_flops": 1e11, "op_seconds": 1e-5, "memory_bytes_per_second": 1e10, "accelerator": "cpu"}
    # Each run costs its tokens at its mean context (20 + 4, 20 + 8), linear in it: 16 x f(28) - 8 x f(24) = 8 x f(32).
    context = prompt + 12
    flops = rows * (2e8 + 4 * 2 * 96 * context) / 1e11
    read = (500_000_000 + rows * context * 1000) / 1e10
    sampling = rows * 50_000 * CPU_SAMPLING_SECONDS_PER_LOGIT
    loop = GENERATE_LOOP_OPS * 1e-5 * NO_GRAD_OP_SHARE  # generate's own ops (the traced forward has none here)
    assert per_token(cpu) == pytest.approx(flops + read + sampling + loop, rel=1e-6)
    assert read > flops  # this model is memory-bound: a FLOP count alone would under-predict it 2.5 x
    # Half the bandwidth: the memory term doubles, the rest stands.
    assert per_token({**cpu, "memory_bytes_per_second": 5e9}) == pytest.approx(flops + 2 * read + sampling + loop,
                                                                                     rel=1e-6)
    gpu = {**cpu, "accelerator": "cuda", "memory_bytes_per_second": 3.35e12, "matmul_flops": 4e14}
    assert per_token(gpu) == pytest.approx(max(rows * (2e8 + 4 * 2 * 96 * context) / 4e14,
                                               (500_000_000 + rows * context * 1000) / 3.35e12) + loop, rel=1e-6)


def test_the_device_reads_its_weights_at_the_probed_or_datasheet_bandwidth(monkeypatch):
    monkeypatch.setenv("XTRAIN_CPU_PROBE", "1.2e11,2.0e-6,7.5e9")
    cpu = device_rates(Hardware(cpus=1), "fp32", 64)
    assert cpu["memory_bytes_per_second"] == cpu["cpu_probe"]["memory_bytes_per_second"] == 7.5e9
    monkeypatch.setenv("XTRAIN_CPU_PROBE", "1.2e11,2.0e-6")  # the two-figure form: the documented default
    from xtrain.plan.probe import DEFAULT_MEMORY_BYTES_PER_SECOND

    assert device_rates(Hardware(cpus=1), "fp32", 64)["memory_bytes_per_second"] == DEFAULT_MEMORY_BYTES_PER_SECOND
    h100 = device_rates(Hardware(accelerator="cuda", gpus=1, gpu_model="h100"), "bf16", 64)
    assert (h100["memory_bytes_per_second"], h100["accelerator"]) == (3.35e12, "cuda")
