"""The plan stage: how a run is laid out, and what it will cost, decided before any device is allocated.

From the model's config (built on the meta device: no weights are read), the prepared data's manifest
and the recipe's hardware, choose precision, micro-batch and accumulation, gradient checkpointing (only
when the run does not fit without it) and the parallel layout (DDP; FSDP when a replica does not fit),
predict peak memory per device (`memory`) and time (`speed`), and size the launch resources the train
rule asks the scheduler for. A run that fits nowhere fails here, naming the smallest changes that fit.
docs/plan.md documents plan.json field by field.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import XtrainError
from ..models.gpus import GPUS
from ..recipe import DATA_KINDS, Hardware, Train
from ..train import allocator
from ..train.backends.capabilities import CAPABILITIES
from . import attention as attentions
from . import compile as compilation
from . import generation, row_order
from .memory import BYTES, Step, analytical, traced
from .model import count_parameters
from .schema import Attention, Compile, Generation, Plan
from .speed import cpu_count, cpu_supports_bf16, quantized_layer_seconds, device_rates, flops_per_token

log = logging.getLogger(__name__)

GIB = 2**30
# Host memory a CPU training process holds besides the step (interpreter, torch, transformers, trl, the data), and
# what the train job's allocator keeps: of the blocks freed across a run's batch shapes, per byte of the traced step's
# peak, and besides that a fixed amount. Fitted on real train-stage runs under TCMalloc (BENCHMARKS.md, "Host memory
# of the 27M rows"): peak RSS = 680 MiB + 1.12 x the traced peak within -6%..+12% on the 27M rows and the whole
# showcase. glibc keeps 1.45x what TCMalloc does (the showcase under each); jemalloc, measured over 16 steps only,
# kept no more than TCMalloc. The lock's mimalloc (with allocator.OPTIONS, which return freed pages with MADV_FREE)
# keeps 380 MiB more whatever the model and 1.02 x the step: fitted on eight quiet runs of the 27M and SmolLM2 and
# the showcase's two cuts, checked on the two QLoRA runs (BENCHMARKS.md, "What mimalloc keeps, refitted").
CPU_PROCESS_BYTES = 680 * 2**20


class Retention(NamedTuple):
    """What an allocator keeps in a CPU training process: a fixed amount, and a factor on the traced step's peak."""

    fixed_bytes: int
    step_factor: float


HOST_RETENTION = {"tcmalloc": Retention(0, 1.12), "mimalloc": Retention(380 * 2**20, 1.02),
                  "jemalloc": Retention(0, 1.12), "glibc": Retention(0, 1.12 * 1.45)}
HOST_REQUEST_MARGIN = 1.25  # the request over that prediction
# A GPU process's host memory besides the weights it loads: the CUDA/HIP runtime's too (not measured here).
GPU_PROCESS_BYTES = int(1.5 * GIB)
HOST_HEADROOM = 0.9  # share of a CPU node's RAM a run may fill; the rest is the OS's
# What torch.cuda.max_memory_allocated does not see: the CUDA/HIP context and cuBLAS workspaces, and the
# caching allocator's fragmentation on top of the tensors' peak.
GPU_CONTEXT_BYTES = int(0.75 * GIB)
ALLOCATOR_SLACK = 1.1
FSDP_GATHERED_BLOCKS = 2  # FSDP holds the current block's full weights and prefetches the next one
GPU_HOST_CPUS = 8  # cores per GPU for the launcher and data loading, when hardware.cpus is unset
# A preference step also runs the reference model forward (no backward) on the same sequences: about a third of a
# forward + backward.
REFERENCE_FORWARD = 1 / 3
REFERENCED = ("dpo", "kto")  # objectives with a reference model (ORPO has none; GRPO's when train.rl.kl_weight > 0)
MIN_MICRO = 2  # KTO's smallest micro-batch: its KL term pairs each answer with another row's prompt (TRL refuses 1)


@dataclass
class Planner:
    """One recipe's model, training method and hardware, and how each candidate step is estimated."""

    model_dir: Path
    train: Train
    hardware: Hardware
    params: dict[str, Any]
    estimator: str = "traced"
    fallback_reason: str | None = None
    trust_remote_code: bool = False  # model.trust_remote_code: the model folder's own code builds it
    sequences: int = 1  # sequences per training row (2 for a DPO pair, and for KTO's answer and its KL pairing)
    reference: str | None = None  # Plan.reference: None for SFT and ORPO
    packed: bool = False  # the prepared rows are packed: each micro-batch trains as one padding-free sequence
    per_device: int = 0  # sequences per device per optimizer step (global batch / devices)
    prompt_tokens: int = 0  # GRPO: the longest prompt, which completions are sampled after
    # The row lengths the attention probe measures a micro-step at, each for an equal share of the rows the run trains
    # on (`trained_lengths`); none: the step's seq_len.
    attention_lengths: tuple[float, ...] = ()
    memory_allocator: str = field(default_factory=lambda: allocator.for_train_job())  # what the train job runs under
    decisions: dict = field(default_factory=dict, repr=False)  # attention's, by the step built with the default

    def attention(self, step: Step) -> tuple[Attention, float]:
        """The attention the plan prefers for this step's shape (plan.attention), and its seconds a micro-step over
        the model's default (0 or less)."""
        step = replace(step, attention=None)
        if step not in self.decisions:
            why_not = self.attention_ruled_out(step)
            self.decisions[step] = attentions.ruled_out(why_not) if why_not else attentions.decide(
                self.attention_shapes(step), self.params["layers"], step.checkpointing,
                max(1, cpu_count(self.hardware) // self.hardware.processes))
        return self.decisions[step]

    def attention_shapes(self, step: Step) -> list[attentions.Shape]:
        """The shapes the attention probe measures this step at: one for each of `attention_lengths`."""
        heads = generation.attention_shape(str(self.model_dir), self.trust_remote_code)
        return [attentions.shape(heads, step.rows, length, step.precision)
                for length in self.attention_lengths or (step.seq_len,)]

    def attention_ruled_out(self, step: Step) -> str | None:
        """Why the model's default attention stays without measuring, if it does."""
        if self.hardware.accelerator != "cpu":
            return "a GPU runs torch's fused attention kernels"
        if not CAPABILITIES[self.train.backend].chooses_attention:
            return f"train.backend {self.train.backend} loads the model itself"
        if step.packed:
            return "packed micro-batches attend block by block, which the probe does not measure"
        default = attentions.default_attention(str(self.model_dir), self.trust_remote_code)
        return None if default == "sdpa" else f"{default}, as the model's class does not support sdpa"

    def breakdown(self, step: Step, strategy: str) -> dict[str, int]:
        """Peak bytes on one device, by kind, with FSDP's sharding applied; for GRPO, those of the larger of the
        training step and the generation phase (`kv_cache` is then a key of both)."""
        training = self.training_breakdown(step, strategy)
        if self.train.objective != "grpo":
            return training
        sampling = self.sampling(step)
        generating = generation.generation_breakdown(training, self.params, self.train, step, sampling,
                                                     self.kv_cache_bytes(step))
        return max({**training, "kv_cache": 0}, generating, key=lambda phase: sum(phase.values()))

    def training_breakdown(self, step: Step, strategy: str) -> dict[str, int]:
        phases = self.estimate(step)
        if strategy != "fsdp":
            return max(phases, key=lambda phase: sum(phase.values()))
        # Sharding shrinks weights, gradients and optimizer states, not activations: the sharded step's peak is the
        # largest of its phases sharded (an unsharded step peaks at the optimizer's update, a sharded one mid-forward).
        n, block = self.hardware.devices, self.params["largest_layer"]
        return max(({
            **phase,
            "weights": phase["weights"] // n + FSDP_GATHERED_BLOCKS * block * BYTES[step.weights_dtype],
            "gradients": phase["gradients"] // n + (block * 4 if self.train.method == "full" else 0),
            "optimizer": phase["optimizer"] // n,
        } for phase in phases), key=lambda phase: sum(phase.values()))

    def sampling(self, step: Step) -> generation.Sampling:
        """GRPO: one device's generation batch under this step's micro-batch."""
        return generation.sampling(self.train.rl, step.micro_batch, self.per_device // step.micro_batch,
                                   self.prompt_tokens)

    def kv_cache_bytes(self, step: Step) -> int:
        return generation.kv_cache_bytes(self.model_dir, self.trust_remote_code, self.sampling(step),
                                         step.weights_dtype)

    def generation_seconds(self, step: Step) -> float:
        """GRPO: seconds of one generation batch on one device."""
        trace = generation.forward_trace(self.model_dir, self.train, step.weights_dtype, self.trust_remote_code)
        rates = device_rates(self.hardware, step.precision, self.params["hidden_size"])
        return generation.generation_seconds(trace, self.params, self.sampling(step), rates)

    def extra_seconds_per_step(self, step: Step, micro_seconds: float) -> float:
        """What GRPO adds to an optimizer step besides its training micro-steps (0 for the other objectives): its
        generations, and the policy's log-prob forward over each sequence when generation and optimizer steps are
        misaligned (the reference's is in `seconds_per_micro_step`)."""
        if self.train.objective != "grpo":
            return 0.0
        sampling = self.sampling(step)
        realigned = sampling.realigned * generation.SCORING_FORWARD * micro_seconds * (self.per_device // step.micro_batch)
        return sampling.per_optimizer_step * self.generation_seconds(step) + realigned

    def estimate(self, step: Step) -> list[dict[str, int]]:
        """Bytes on one device at the peak of each phase of the step (the traced segments; the analytical estimate
        is one), unsharded."""
        phases = None
        if self.estimator == "traced":
            try:
                phases = [dict(phase) for phase in
                          traced(self.model_dir, self.train, step, self.trust_remote_code, self.params).phases]
            except Exception as exc:  # an architecture the fake-tensor trace cannot run: fall back, say why
                self.estimator, self.fallback_reason = "analytical", f"{type(exc).__name__}: {exc}"[:300]
                log.warning("memory trace failed, using the analytical estimator: %s", self.fallback_reason)
        phases = phases or [analytical(self.params, self.train.method, step, self.train)]
        if self.reference == "copy":  # the frozen reference model
            for phase in phases:
                phase["weights"] += self.params["total"] * BYTES[step.weights_dtype]
        return phases

    def reserved(self, peak: int) -> int:
        return reserved_bytes(peak, self.hardware)

    def budget(self, gpu: str | None = None) -> int:
        return device_budget(self.hardware, gpu)

    def fits(self, step: Step, strategy: str) -> bool:
        return self.reserved(sum(self.breakdown(step, strategy).values())) <= self.budget()

    def seconds_per_micro_step(self, step: Step, tokens: float) -> tuple[float, dict[str, Any]]:
        """Predicted seconds of one forward+backward(+optimizer) over `tokens` tokens, and its terms."""
        rates = device_rates(self.hardware, step.precision, self.params["hidden_size"], full=not self.train.adapters)
        if self.estimator == "traced":
            # Traced with the model's default attention, which the CPU rates were fitted on; eager's measured
            # difference is added below.
            trace = traced(self.model_dir, self.train, replace(step, attention=None), self.trust_remote_code,
                           self.params)
            per_token, ops, source = trace.flops / (step.rows * step.seq_len), trace.ops, "traced"
        else:  # without a trace the op count is unknown: small models will run slower than predicted
            attended = step.seq_len * (step.rows if step.packed else 1)  # tokens each token's attention spans
            per_token, ops, source = flops_per_token(self.params, attended, step.checkpointing), 0, "analytical"
        seconds = tokens * per_token / rates["matmul_flops"] + ops * rates["op_seconds"]
        if step.attention:
            seconds += self.attention(step)[1]
        if self.train.method == "qlora":
            seconds += quantized_layer_seconds(self.params["quantized"], step.checkpointing, self.hardware.accelerator)
        if self.reference in ("adapter", "copy"):  # the reference forward in each step
            seconds *= 1 + REFERENCE_FORWARD
        return seconds, {"flops_per_token": round(per_token), "flops_source": source, "ops_per_micro_step": ops,
                         "device_flops": rates["matmul_flops"], "op_seconds": rates["op_seconds"],
                         "throughput_source": rates["source"],
                         # The recorded figures the CPU rates rest on (plan.probe), so a reader can check them.
                         **({"cpu_probe": rates["cpu_probe"]} if "cpu_probe" in rates else {})}


def make_plan(
    model_dir: Path, manifest: dict, train: Train, hardware: Hardware, trust_remote_code: bool = False
) -> Plan:
    params = count_parameters(model_dir, train, trust_remote_code)
    data = manifest["splits"]["train"]
    if manifest.get("data_kind", "chats") != DATA_KINDS[train.objective]:
        raise XtrainError(f"the prepared data holds {manifest.get('data_kind', 'chats')}, train.objective "
                          f"{train.objective} trains on {DATA_KINDS[train.objective]}: re-run prepare")
    if train.global_batch_size > data["rows"]:
        # An error, not a clamp: a smaller batch changes the optimisation (its learning rate, steps) the recipe chose.
        raise XtrainError(f"train.global_batch_size {train.global_batch_size} is larger than the {data['rows']} "
                          f"training rows: no step could hold it; set it to at most {data['rows']} (a multiple of the "
                          "devices), and the learning rate to suit")
    sequences = data.get("sequences_per_row", 1) + (train.objective == "kto")  # KTO adds a KL pairing per answer
    per_device = check_micro_batch(train, hardware)
    planner = Planner(model_dir, train, hardware, params, trust_remote_code=trust_remote_code, sequences=sequences,
                      reference=first_reference(train), packed=bool(manifest.get("packing")), per_device=per_device)
    # Batches are padded to their longest row, so the longest row sets the peak.
    longest = min(data.get("max_len") or manifest["seq_len"], manifest["seq_len"])
    mean_len = data["tokens"] / (data["rows"] * data.get("sequences_per_row", 1))
    if train.objective == "grpo":  # a GRPO row trains as its prompt and a completion sampled at worst to the end
        planner.prompt_tokens = longest
        completion = train.rl.max_completion_length
        longest, mean_len = min(longest + completion, manifest["seq_len"]), mean_len + completion
    steps = train.max_steps or math.ceil(math.ceil(data["rows"] / train.global_batch_size) * train.epochs)
    trained_len = trained_rows_mean_length(train, planner.packed, data, mean_len, longest, steps)
    planner.attention_lengths = trained_lengths(train, planner.packed, data, trained_len, longest)

    candidates_precisions = precisions(hardware, train.backend)
    candidates = fitting_steps(planner, candidates_precisions, per_device, longest, trained_len)
    if not candidates and planner.reference == "copy" and train.objective in REFERENCED:  # GRPO has no precompute
        log.info("plan: a frozen reference copy does not fit beside the full fine-tune; the reference log-probs are "
                 "computed once over the train rows before training instead (reference: precomputed)")
        planner.reference = "precomputed"
        candidates = fitting_steps(planner, candidates_precisions, per_device, longest, trained_len)
    if not candidates:
        raise does_not_fit(planner, candidates_precisions[0], per_device, longest)
    # The fastest precision that fits, each compiled where that pays.
    step_seconds, layout, speed, compiling = min((with_compile(planner, *candidate, steps, longest, trained_len)
                                                  for candidate in candidates), key=lambda c: total_seconds(c, steps))
    step = layout["step"]
    breakdown = planner.breakdown(step, layout["strategy"])
    peak = sum(breakdown.values())
    precompute = (REFERENCE_FORWARD * step_seconds * math.ceil(data["rows"] / train.global_batch_size)
                  if planner.reference == "precomputed" else None)
    seconds = total_seconds((step_seconds, layout, speed, compiling), steps) + (precompute or 0)
    return Plan.model_validate({
        "model": params,
        "data": {
            "train_rows": data["rows"],
            "train_tokens": data["tokens"],
            "supervised_tokens": data["supervised_tokens"],
            "seq_len": manifest["seq_len"],
            "longest_sequence_tokens": longest,
            "mean_sequence_tokens": round(mean_len, 1),
            "fingerprint": manifest["fingerprint"],
        },
        "layout": {
            "strategy": layout["strategy"],
            "devices": hardware.devices,
            "nodes": hardware.nodes,
            "global_batch_size": train.global_batch_size,
            "micro_batch_size": step.micro_batch,
            "gradient_accumulation_steps": layout["accumulation"],
        },
        "precision": step.precision,
        "weights_dtype": step.weights_dtype,
        "gradient_checkpointing": step.checkpointing,
        "compile": compiling,
        "attention": attention_figures(planner, step),
        "reference": planner.reference,
        "generation": generation_figures(planner, step, layout["strategy"]) if train.objective == "grpo" else None,
        "memory": {
            "estimator": planner.estimator,
            **({"trace_error": planner.fallback_reason} if planner.fallback_reason else {}),
            "device": hardware.gpu or "cpu",
            "peak_bytes_per_device": peak,
            "reserved_bytes_per_device": planner.reserved(peak),
            "budget_bytes_per_device": planner.budget(),
            "breakdown_bytes": breakdown,
            "analytical_peak_bytes_per_device": int(sum(analytical(params, train.method, step, train).values())),
        },
        "time": {
            "steps": steps,
            "tokens_per_step": round(train.global_batch_size * sequences * trained_len),
            **speed,
            "seconds_per_step": round(step_seconds, 4),
            "reference_precompute_seconds": None if precompute is None else round(precompute, 1),
            "seconds": round(seconds, 1),
        },
        "resources": resources(planner, peak, seconds),
    })


def trained_rows_mean_length(train: Train, packed: bool, data: dict, mean_len: float, longest: int,
                             steps: int) -> float:
    """The mean length of the rows the run's steps train on: the split's, unless the backend sends unpacked SFT rows
    length-grouped and the run stops inside a megabatch, whose first rows are its longest (`row_order`)."""
    if not length_grouped(train, packed, data):
        return mean_len
    rows_trained = steps * train.global_batch_size if train.max_steps else round(data["rows"] * train.epochs)
    trained = row_order.trained_mean_length(data["length_histogram"], data["rows"], mean_len, longest, rows_trained,
                                            train.global_batch_size)
    if abs(trained / mean_len - 1) >= 0.01:
        log.info("plan: the run's %d steps stop inside a length-grouped megabatch, whose rows go out longest first: "
                 "they average %.0f tokens against the split's %.0f", steps, trained, mean_len)
    return trained


def trained_lengths(train: Train, packed: bool, data: dict, trained_len: float, longest: int) -> tuple[float, ...]:
    """The row lengths the attention probe measures at: where batches are length-grouped, the root-mean-square length
    of each of LENGTH_SHARES equal shares of the rows (their histogram, averaging the trained rows' mean), as
    attention's cost grows with the square of each batch's length; otherwise the trained rows' mean."""
    if not length_grouped(train, packed, data):
        return (trained_len,)
    return tuple(row_order.length_shares(data["length_histogram"], trained_len, longest, attentions.LENGTH_SHARES))


def length_grouped(train: Train, packed: bool, data: dict) -> bool:
    """The backend sends unpacked SFT rows length-grouped, and the split's length histogram is known."""
    return (train.objective == "sft" and not packed and CAPABILITIES[train.backend].groups_by_length
            and "length_histogram" in data)


def with_compile(planner: Planner, step_seconds: float, layout: dict, speed: dict, steps: int, longest: int,
                 mean_len: float) -> tuple[float, dict, dict, Compile]:
    """A fitting candidate under the compile decision: its step seconds, its layout (compiled batches are padded to
    a bucket, which memory must allow), its speed terms and the decision."""
    train, step = planner.train, layout["step"]
    shapes = compilation.batch_shapes(longest, mean_len)
    accumulation = layout["accumulation"]
    decision = compilation.decide(
        planner.hardware.accelerator, step.precision, planner.memory_allocator, train.objective, train.backend,
        CAPABILITIES[train.backend].compiles, steps * accumulation, step_seconds / accumulation,
        speed["ops_per_micro_step"], shapes, mean_len)
    if not decision.mode:
        return step_seconds, layout, speed, decision
    bucket = decision.pad_to_multiple_of or 1
    padded = replace(step, seq_len=-(-longest // bucket) * bucket)
    if not planner.fits(padded, layout["strategy"]):
        return step_seconds, layout, speed, decision.model_copy(update={
            "mode": None, "warmup_seconds": 0.0, "pad_to_multiple_of": None,
            "reason": f"eager: batches padded to {padded.seq_len} tokens would not fit"})
    compiled_seconds = step_seconds * compilation.padding(shapes, mean_len) / decision.speedup
    return compiled_seconds, {**layout, "step": padded}, speed, decision


def total_seconds(candidate: tuple[float, dict, dict, Compile], steps: int) -> float:
    step_seconds, _, _, compiling = candidate
    return steps * step_seconds + compiling.warmup_seconds


def first_reference(train: Train) -> str | None:
    """Where a DPO, KTO or GRPO (train.rl.kl_weight > 0) run's reference log-probs come from, before memory decides:
    LoRA's base with the adapter disabled, or (full fine-tune) a frozen copy, which `make_plan` trades for
    precomputed log-probs when it does not fit (DPO and KTO only: GRPO's sequences are sampled as it trains)."""
    grpo_reference = train.objective == "grpo" and train.rl.kl_weight != 0
    if train.objective not in REFERENCED and not grpo_reference:
        return None
    return "adapter" if train.adapters else "copy"


def generation_figures(planner: Planner, step: Step, strategy: str) -> Generation:
    """plan.json's `generation`: the GRPO generation phase of the chosen layout."""
    sampling = planner.sampling(step)
    training = planner.training_breakdown(step, strategy)
    generating = generation.generation_breakdown(training, planner.params, planner.train, step, sampling,
                                                 planner.kv_cache_bytes(step))
    trace = generation.forward_trace(planner.model_dir, planner.train, step.weights_dtype, planner.trust_remote_code)
    seconds = planner.generation_seconds(step)
    return Generation(
        completions_per_device=sampling.completions, prompts_per_device=sampling.completions // planner.train.rl.generations,
        prompt_tokens=sampling.prompt_tokens, completion_tokens=sampling.completion_tokens,
        generations_per_step=sampling.per_optimizer_step, policy_logps_recomputed=sampling.realigned,
        kv_cache_bytes=generating["kv_cache"], peak_bytes_per_device=sum(generating.values()),
        training_peak_bytes_per_device=sum(training.values()), breakdown_bytes=generating,
        decode_flops_per_token=round(trace.flops_per_token), ops_per_forward=trace.ops,
        ops_per_new_token=trace.ops + generation.GENERATE_LOOP_OPS, seconds=round(seconds, 4),
        tokens_per_second=round(sampling.completions * sampling.completion_tokens / seconds, 1),
        seconds_per_step=round(seconds * sampling.per_optimizer_step, 4))


def fitting_steps(planner: Planner, candidate_precisions: list[str], per_device: int, longest: int,
                  mean_len: float) -> list[tuple[float, dict, dict]]:
    """(seconds per optimizer step, layout, speed terms) of each precision with a layout that fits."""
    candidates = []
    for precision in candidate_precisions:
        layout = choose_layout(planner, precision, per_device, longest)
        if layout:
            micro_seconds, speed = planner.seconds_per_micro_step(layout["step"], layout["step"].rows * mean_len)
            extra = planner.extra_seconds_per_step(layout["step"], micro_seconds)
            candidates.append((micro_seconds * layout["accumulation"] + extra, layout, speed))
    return candidates


def device_precisions(hardware: Hardware) -> list[str]:
    """Autocast dtypes the device runs: bf16 where it has it natively, fp16 on older GPUs, fp32 on CPUs."""
    if hardware.accelerator != "cpu":
        return ["bf16" if GPUS[hardware.gpu].bf16 else "fp16"]
    return ["fp32", "bf16"] if cpu_supports_bf16() else ["fp32"]


def precisions(hardware: Hardware, backend: str) -> list[str]:
    """Candidate autocast dtypes: the device's that the backend trains in (preflight refuses an empty list)."""
    trains_in = CAPABILITIES[backend].precisions
    usable = [p for p in device_precisions(hardware) if p in trains_in]
    if not usable:
        raise XtrainError(f"train.backend {backend} trains in {', '.join(trains_in)}, "
                          f"but {hardware.gpu or 'this CPU'} runs only {', '.join(device_precisions(hardware))}: choose "
                          "another hardware.gpu_model or train.backend")
    return usable


def check_micro_batch(train: Train, hardware: Hardware) -> int:
    """Sequences per device per optimizer step; a fixed micro-batch must divide it."""
    per_device = train.global_batch_size // hardware.devices
    if train.objective == "kto" and min(train.micro_batch_size or per_device, per_device) < MIN_MICRO:
        raise XtrainError(
            f"train.objective kto estimates its KL term from the other rows of a micro-batch, so it needs at least "
            f"{MIN_MICRO} rows per device per forward pass: raise train.global_batch_size (now {train.global_batch_size}"
            f" over {hardware.devices} devices){' or train.micro_batch_size' if train.micro_batch_size else ''}"
        )
    if train.micro_batch_size and per_device % train.micro_batch_size:
        raise XtrainError(
            f"train.micro_batch_size {train.micro_batch_size} does not divide the per-device batch {per_device} "
            f"(global_batch_size {train.global_batch_size} over {hardware.devices} devices); choose a divisor"
        )
    return per_device


def strategies(planner: Planner) -> list[str]:
    if planner.hardware.devices == 1:
        return ["single"]
    # accelerate runs CPU processes as DDP only (it ignores an FSDP plugin there).
    return ["ddp"] if planner.hardware.accelerator == "cpu" else ["ddp", "fsdp"]


def first_step(planner: Planner, precision: str, micro: int, seq_len: int, checkpointing: bool) -> Step:
    hardware = planner.hardware
    # Full fine-tunes keep fp32 master weights; LoRA holds the frozen base in the GPU's 16-bit dtype.
    weights = precision if planner.train.adapters and hardware.accelerator != "cpu" else "fp32"
    return Step(micro, seq_len, precision, weights, checkpointing, sequences=planner.sequences, packed=planner.packed,
                accumulating=planner.per_device > micro)


def choose_layout(planner: Planner, precision: str, per_device: int, seq_len: int) -> dict[str, Any] | None:
    """Largest micro-batch that fits: without checkpointing if any does, replicas (DDP) before shards (FSDP)."""
    train = planner.train
    smallest = MIN_MICRO if train.objective == "kto" else 1
    micros = [train.micro_batch_size] if train.micro_batch_size else [m for m in range(per_device, 0, -1)
                                                                      if per_device % m == 0 and m >= smallest]
    for checkpointing in (False, True):
        for strategy in strategies(planner):
            # Memory grows with the micro-batch: when the smallest does not fit, no other will (a trace saved).
            if not planner.fits(first_step(planner, precision, micros[-1], seq_len, checkpointing), strategy):
                continue
            for index, micro in enumerate(micros):
                step = fitting_attention(planner, first_step(planner, precision, micro, seq_len, checkpointing),
                                         strategy)
                if step:
                    if planner.packed:  # attention spans the whole micro-batch: a smaller one can be faster
                        micro = fastest_packed_micro(planner, precision, micros[index:], per_device, seq_len, checkpointing)
                        step = first_step(planner, precision, micro, seq_len, checkpointing)
                    return {"step": step, "strategy": strategy, "accumulation": per_device // micro}
    return None


def fitting_attention(planner: Planner, step: Step, strategy: str) -> Step | None:
    """The step with the attention the plan prefers where that fits, else with the model's default where that does;
    None where neither fits (eager holds each layer's attention probabilities: it never fits where the default
    does not)."""
    eager = replace(step, attention="eager")
    if planner.attention(step)[0].implementation == "eager" and planner.fits(eager, strategy):
        return eager
    return step if planner.fits(step, strategy) else None


def attention_figures(planner: Planner, step: Step) -> Attention:
    """plan.json's `attention`: the decision for the chosen step, or why a preferred eager step was not taken."""
    decision = planner.attention(step)[0]
    if decision.implementation == "eager" and not step.attention:
        reason = f"the model's default: eager's step would not fit ({decision.reason})"
        return decision.model_copy(update={"implementation": None, "reason": reason})
    return decision


def fastest_packed_micro(planner: Planner, precision: str, micros: list[int], per_device: int, seq_len: int,
                         checkpointing: bool) -> int:
    """Of the micro-batches that fit (`micros`, largest first), the one whose optimizer step is predicted fastest:
    a packed micro-batch trains as one sequence, so its attention grows with the square of its rows."""
    def step_seconds(micro: int) -> float:
        step = first_step(planner, precision, micro, seq_len, checkpointing)
        return planner.seconds_per_micro_step(step, step.rows * seq_len)[0] * (per_device // micro)

    return min(micros, key=step_seconds)


def does_not_fit(planner: Planner, precision: str, per_device: int, seq_len: int) -> XtrainError:
    """The error for a run that fits in no layout, naming each single change that would make it fit."""
    hardware, train = planner.hardware, planner.train
    strategy = strategies(planner)[-1]
    micro = train.micro_batch_size or 1
    smallest = first_step(planner, precision, micro, seq_len, checkpointing=True)
    need = planner.reserved(sum(planner.breakdown(smallest, strategy).values()))
    fixes = []
    shorter = seq_len // 2
    while shorter >= 16 and not planner.fits(replace(smallest, seq_len=shorter), strategy):
        shorter //= 2
    if shorter >= 16:
        fixes.append(f"data.seq_len: {shorter} (rows now reach {seq_len} tokens)")
    if train.method == "full":
        lora = replace(planner, train=Train(method="lora"), estimator="traced", fallback_reason=None,
                       params=count_parameters(planner.model_dir, Train(), planner.trust_remote_code))
        if choose_layout(lora, precision, per_device, seq_len):
            fixes.append("train.method: lora")
    if hardware.accelerator != "cpu":
        fixes += more_gpus(planner, smallest, need)
    where = (f"{hardware.gpu} ({planner.budget() / GIB:.1f} GiB)" if hardware.accelerator != "cpu"
             else f"host RAM ({planner.budget() / GIB:.1f} GiB after the process's own)")
    settings = f"micro-batch {micro}, gradient checkpointing, {precision}" + (", FSDP" if strategy == "fsdp" else "")
    advice = ("Smallest changes that fit, each on its own: " + "; ".join(fixes) if fixes else
              "No single change fits: lower data.seq_len, use train.method: lora, and add GPUs (hardware.gpus) together")
    return XtrainError(f"the run does not fit: {need / GIB:.2f} GiB per device even with {settings}, "
                       f"over {where}. {advice}")


def more_gpus(planner: Planner, step: Step, need: int) -> list[str]:
    """More devices (FSDP shards weights, gradients and optimizer states), or one larger GPU model."""
    fixes = []
    for devices in range(planner.hardware.devices + 1, 1025):
        more = replace(planner, hardware=planner.hardware.model_copy(update={"gpus": devices, "nodes": 1}))
        if more.fits(step, "fsdp"):
            fixes.append(f"hardware.gpus x hardware.nodes: {devices} GPUs in all, with FSDP")
            break
    vendor = GPUS[planner.hardware.gpu].vendor
    larger = sorted((gpu.memory_gib, name) for name, gpu in GPUS.items()
                    if gpu.vendor == vendor and gpu.memory_gib * GIB >= need)
    if larger:
        unset = " and no hardware.gpu_memory_gb" if planner.hardware.gpu_memory_gb else ""
        fixes.append(f"hardware.gpu_model: {larger[0][1]} ({larger[0][0]:.0f} GiB){unset}")
    return fixes


def reserved_bytes(peak: int, hardware: Hardware) -> int:
    """What a device must hold for a tensor peak of `peak` bytes."""
    return peak if hardware.accelerator == "cpu" else int(peak * ALLOCATOR_SLACK) + GPU_CONTEXT_BYTES


def device_budget(hardware: Hardware, gpu: str | None = None) -> int:
    """Bytes one device offers: a GPU's memory (of `gpu` if given), or a CPU process's share of its node's RAM less
    its own."""
    if hardware.accelerator == "cpu":
        total = (hardware.host_memory_gb * GIB if hardware.host_memory_gb
                 else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        return int(total * HOST_HEADROOM) // hardware.processes - CPU_PROCESS_BYTES
    if gpu is None and hardware.gpu_memory_gb:
        return int(hardware.gpu_memory_gb * GIB)
    return int(GPUS[gpu or hardware.gpu].memory_gib * GIB)


def cpu_process_bytes(peak: int, memory_allocator: str) -> int:
    """A CPU training process's peak RSS for a traced step of `peak` bytes under `memory_allocator`."""
    kept = HOST_RETENTION[memory_allocator]
    return int(CPU_PROCESS_BYTES + kept.fixed_bytes + peak * kept.step_factor)


def resources(planner: Planner, peak: int, seconds: float) -> dict[str, Any]:
    """What the train job asks the scheduler for, per node: GPUs, cores, host memory, minutes."""
    hardware, params, memory_allocator = planner.hardware, planner.params, planner.memory_allocator
    if hardware.accelerator == "cpu":
        # A 4-bit base loaded on the CPU keeps its checkpoint files mapped, every page of them read while quantizing:
        # resident beside the 4-bit copies (BENCHMARKS.md, "A 4-bit base's mapped checkpoint").
        mapped = params.get("quantized_stored_bytes") or 0
        host_bytes = hardware.processes * (cpu_process_bytes(peak, memory_allocator) + mapped)
        cpus = cpu_count(hardware)
    else:  # each GPU's process holds a host copy of the weights while loading them
        host_bytes = hardware.gpus * (GPU_PROCESS_BYTES + params["total"] * 4)
        cpus = hardware.cpus or GPU_HOST_CPUS * hardware.gpus
    return {
        "gpus": hardware.gpus,
        "nodes": hardware.nodes,
        "cpus": cpus,
        "mem_mb": math.ceil(host_bytes * HOST_REQUEST_MARGIN / 2**20),
        "allocator": memory_allocator,
        # Half again the prediction, plus ten minutes for loading, saving and scheduling.
        "runtime": math.ceil(seconds * 1.5 / 60) + 10,
    }
