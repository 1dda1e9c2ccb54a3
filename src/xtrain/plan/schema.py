"""plan.json as a typed model: what the plan stage writes and every later stage reads.

`make_plan` returns a `Plan`; `write_plan` and `read_plan` validate it on the way to and from disk, so a plan
written by another version of xtrain, or edited by hand into something inconsistent, is an error naming the
file and the field rather than a KeyError inside a backend. docs/plan.md's field table is generated from the
descriptions here (`python -m xtrain.project.docs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..artifacts import read_json, write_json
from ..errors import XtrainError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(Section):
    """The model, counted on the meta device (no weights are read)."""

    total: int = Field(description="parameters")
    trainable: int = Field(description="parameters that train (the LoRA adapters, or all of them)")
    quantized: int | None = Field(None, description="train.method qlora: weights of the linear layers stored in 4 "
                                  "bits (every nn.Linear of the base but the output head)")
    largest_quantized: int | None = Field(None, description="train.method qlora: weights of the largest of those "
                                          "layers (the one dequantized copy held at a time)")
    quantized_stored_bytes: int | None = Field(None, description="train.method qlora: those weights' bytes in the "
                                               "checkpoint's files, read while quantizing and kept in host memory "
                                               "on the CPU (the files stay mapped: the unquantized tensors are views "
                                               "into them)")
    largest_layer: int = Field(description="parameters of the largest decoder block (FSDP's unit)")
    layers: int = Field(description="decoder blocks")
    hidden_size: int = Field(description="model width")
    intermediate_size: int = Field(description="MLP width")
    vocab_size: int = Field(description="vocabulary entries")


class DataShape(Section):
    """The prepared train split (from its manifest)."""

    train_rows: int = Field(description="rows (sequences) of the train split")
    train_tokens: int = Field(description="their tokens")
    supervised_tokens: int = Field(description="tokens the loss is computed on")
    seq_len: int = Field(description="`data.seq_len`")
    longest_sequence_tokens: int = Field(description="the longest row: batches are padded to it, so it sets the peak")
    mean_sequence_tokens: float = Field(
        description="the split's mean row length: it sets the time (with the rows a short run trains on: "
        "`time.tokens_per_step`)"
    )
    fingerprint: str = Field(description="the prepared data's fingerprint (manifest.json)")


class Layout(Section):
    """How the global batch is laid out over devices and steps."""

    strategy: Literal["single", "ddp", "fsdp"] = Field(
        description="one device; DDP replicas; or FSDP shards (weights, gradients, optimizer states), chosen only "
        "when a replica does not fit"
    )
    devices: int = Field(description="data-parallel workers: GPUs, or CPU processes, over all nodes")
    nodes: int = Field(description="`hardware.nodes`")
    global_batch_size: int = Field(description="`train.global_batch_size`")
    micro_batch_size: int = Field(description="sequences per device per forward pass: the largest that fits")
    gradient_accumulation_steps: int = Field(description="global batch / (micro-batch × devices)")


class Memory(Section):
    """Predicted memory of one device at the step's peak."""

    estimator: Literal["traced", "analytical"] = Field(
        description="`traced` (one training step on fake tensors), or `analytical` when the trace failed"
    )
    trace_error: str | None = Field(None, description="why the trace failed (only with `analytical`)")
    device: str = Field(description="the GPU model planned for, or `cpu`")
    peak_bytes_per_device: int = Field(description="the tensors' peak")
    reserved_bytes_per_device: int = Field(
        description="what the device must hold for it: on GPUs the peak × 1.1 (caching allocator) + 0.75 GiB context"
    )
    budget_bytes_per_device: int = Field(
        description="what one device offers (GPU memory; or host RAM × 0.9 / processes − 680 MiB)"
    )
    breakdown_bytes: dict[str, int] = Field(
        description="the peak by kind, at the moment of the peak: `weights` (and buffers), `gradients`, `optimizer` "
        "(AdamW states), `activations` (saved for backward, logits included), `workspace` (temporaries of backward)"
    )
    analytical_peak_bytes_per_device: int = Field(description="the analytical estimator's peak: the cross-check")


class CpuProbe(Section):
    """The recorded CPU probe a CPU plan's rates rest on (`xtrain.plan.probe`)."""

    matmul_flops: float = Field(description="matmul FLOP/s at the model's width, in the step's precision")
    op_seconds: float = Field(description="seconds per small autograd op")
    memory_bytes_per_second: float | None = Field(
        None, description="bytes per second one-row fp32 matmuls of the model's width stream weights from memory at "
        "(a decode step's read: `generation.seconds`, the evaluate job's generation); a record of its own in the "
        "cache, or XTRAIN_CPU_PROBE's third figure (1e10 when it gives two)")
    load_per_core: float | None = Field(None, description="load average per core while it was measured")


class Time(Section):
    """Predicted time."""

    steps: int = Field(description="optimizer steps: `max_steps`, or ⌈rows / global batch⌉ × epochs")
    tokens_per_step: int = Field(
        description="global batch × the mean length of the rows the steps train on: the split's mean, or, where the "
        "backend sends unpacked SFT rows length-grouped and `max_steps` stops inside a megabatch, the expected length "
        "of that megabatch's first (longest) rows (xtrain.plan.row_order)"
    )
    flops_per_token: int = Field(
        description="training FLOPs per token, recomputation included: counted by the trace with torch's per-op "
        "formulas (`flops_source: traced`), else 6·N full / 4·N + 2·trainable LoRA plus 12·layers·hidden·seq attention"
    )
    flops_source: Literal["traced", "analytical"] = Field(description="where `flops_per_token` came from")
    ops_per_micro_step: int = Field(description="aten ops one micro-step dispatches (from the trace; 0 for analytical)")
    device_flops: float = Field(
        description="matmul FLOP/s one device reaches in training: GPU peak × MFU (0.4 CUDA, 0.35 ROCm), or the CPU "
        "probe × 0.75 fp32 / 0.38 bf16 (0.42 for a bf16 full fine-tune; a CPU device: one process, with cores / `hardware.processes` threads)"
    )
    op_seconds: float = Field(description="cost of one dispatched op: 8 µs on GPUs; on CPUs the probed bare op × 4")
    throughput_source: str = Field(description="where `device_flops` came from")
    cpu_probe: CpuProbe | None = Field(None, description="CPU plans only: the probe figures the rates rest on")
    seconds_per_step: float = Field(
        description="accumulation × (micro tokens × flops_per_token / device_flops + ops × op_seconds); compiled: "
        "× the bucket padding / `compile.speedup`; GRPO: + `generation.seconds_per_step`"
    )
    reference_precompute_seconds: float | None = Field(
        None, description="`reference: precomputed` only: one reference forward over every train row before step 1 "
        "(a third of a step's compute per global batch of rows), included in `seconds`"
    )
    seconds: float = Field(description="steps × seconds_per_step (+ the reference precompute and the compile "
                           "warm-up); data-parallel communication is not included")


class Compile(Section):
    """Whether the step runs under `torch.compile` (`xtrain.plan.compile`), and why."""

    mode: Literal["default"] | None = Field(None, description="torch.compile mode the backend trains with; null: eager")
    speedup: float | None = Field(
        None, description="measured step speed-up of compiling on this device and precision (on a CPU, under "
        "`resources.allocator`; BENCHMARKS.md \"Compiled training\"); null where unmeasured"
    )
    warmup_seconds: float = Field(description="compile time, included in `time.seconds`: 2 ms per traced op, per compile")
    batch_shapes: int = Field(
        description="padded batch lengths the run can see (1 when every row is as long as the longest, else "
        "seq_len / 16); more than one costs a second compile with a symbolic length"
    )
    pad_to_multiple_of: int | None = Field(None, description="compiled runs pad each batch up to a multiple of 16 tokens")
    reason: str = Field(description="the decision in words: the time it saves against the compile, or what rules it out")


class Attention(Section):
    """Which attention the step runs (`xtrain.plan.attention`): transformers' default for the model, or eager where
    this CPU measures it faster at the run's shape and its step fits."""

    implementation: Literal["eager"] | None = Field(
        None, description="`attn_implementation` the backend loads the model with; null: the model's default (sdpa "
        "where its class supports torch's fused kernel)")
    default_seconds: float | None = Field(None, description="one micro-step's attention (every layer, forward and "
                                          "backward) under sdpa, measured by the CPU's attention probe")
    eager_seconds: float | None = Field(None, description="the same under eager; `time` adds the difference to the "
                                        "default's traced step where eager is chosen")
    reason: str = Field(description="the decision in words: the measured seconds, or what rules the choice out")


class Generation(Section):
    """train.objective grpo: the generation phase of each optimizer step, as TRL's GRPOTrainer runs it (generate with
    the KV cache, no grad, outside autocast), beside the training step on prompt + completion rows."""

    completions_per_device: int = Field(description="completions one device samples at once: micro-batch × "
                                        "`train.rl.steps_per_generation` (default: the accumulation steps)")
    prompts_per_device: int = Field(description="their prompts: completions / `train.rl.generations`")
    prompt_tokens: int = Field(description="the longest prompt: the batch is left-padded to it")
    completion_tokens: int = Field(description="`train.rl.max_completion_length`: every completion counted to the "
                                   "end (the worst case; a completion that ends early costs less)")
    generations_per_step: float = Field(description="generation batches per optimizer step: accumulation / "
                                        "steps_per_generation")
    policy_logps_recomputed: bool = Field(description="accumulation is not a multiple of steps_per_generation, so TRL "
                                          "scores each sequence with the policy once more (a no-grad forward)")
    kv_cache_bytes: int = Field(description="the KV cache at full length: completions × (prompt + completion tokens) "
                                "× layers × 2 × key-value heads × head dim, in the weights' dtype")
    peak_bytes_per_device: int = Field(description="the generation phase's peak: resident weights (the reference copy "
                               "included) and AdamW states, gradients when it falls inside an optimizer step, the KV "
                               "cache, and the larger of the prompts' forward and the sampling's last-position logits")
    training_peak_bytes_per_device: int = Field(description="the training step's traced peak on prompt + completion "
                                                "rows; `memory.peak_bytes_per_device` is the larger of the two")
    breakdown_bytes: dict[str, int] = Field(description="the generation phase's peak by kind: `weights`, `gradients`, "
                                            "`optimizer`, `activations` (prefill or sampling transients), `kv_cache`")
    decode_flops_per_token: int = Field(description="matmul FLOPs of one new token's forward (traced on fake "
                                        "tensors), before attention over the context (4 × layers × width per token)")
    ops_per_forward: int = Field(description="aten ops of one decode forward (traced)")
    ops_per_new_token: int = Field(description="the forward's ops plus generate's own (sampling, stopping, cache "
                                   "bookkeeping: 39, counted on real tensors by bench/bench_grpo_plan.py)")
    seconds: float = Field(description="one generation batch: the prompts' forward, then per new token completions × "
                           "FLOPs / `time.device_flops` and (every weight + the KV cache so far) / the memory "
                           "bandwidth (a CPU's `time.cpu_probe.memory_bytes_per_second`: the two added, and the "
                           "sampling, 21 ns per completion and vocabulary entry; a GPU's datasheet bandwidth: the "
                           "slower of the two), + ops × `time.op_seconds` × 0.55 (no autograd), and GRPOTrainer's "
                           "bookkeeping and logging around it: 1,600 × `time.op_seconds`")
    tokens_per_second: float = Field(description="completion tokens generated per second on one device")
    seconds_per_step: float = Field(description="generation seconds per optimizer step, included in "
                                    "`time.seconds_per_step`")


class Resources(Section):
    """What the train job asks the scheduler for, per node (the train rule's resources)."""

    gpus: int = Field(description="`hardware.gpus`")
    nodes: int = Field(description="`hardware.nodes`")
    cpus: int = Field(description="`hardware.cpus`, else the planning machine's cores (CPU) or 8 per GPU")
    mem_mb: int = Field(
        description="host memory per node × 1.25: per CPU process 680 MiB (the process) plus the peak × 1.12 (what "
        "TCMalloc or jemalloc keeps across batch shapes), × 1.62 under glibc, 380 MiB + × 1.02 under mimalloc, plus "
        "`model.quantized_stored_bytes` for a 4-bit base; per GPU 1.5 GiB plus an fp32 copy of the weights while loading"
    )
    allocator: Literal["tcmalloc", "mimalloc", "jemalloc", "glibc"] = Field(
        description="the allocator the train job runs under (`xtrain.train.allocator`): the planning machine's "
        "TCMalloc, else the lock's mimalloc (cmeel-mimalloc), else the machine's jemalloc, preloaded; else glibc's"
    )
    runtime: int = Field(description="minutes: 1.5 × the predicted time + 10 for loading, saving and scheduling")


class Plan(Section):
    """plans/<recipe>/plan.json."""

    model: ModelShape
    data: DataShape
    layout: Layout
    precision: Literal["fp32", "bf16", "fp16"] = Field(description="autocast dtype (fp32: none)")
    weights_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        description="dtype the weights are held in: fp32, or the GPU's 16-bit dtype for a LoRA base"
    )
    gradient_checkpointing: bool = Field(description="recompute activations in backward: only when the run needs it")
    compile: Compile
    attention: Attention | None = Field(None, description="the attention implementation (plans made before it was "
                                        "chosen have none: the model's default)")
    reference: Literal["adapter", "copy", "precomputed"] | None = Field(
        None, description="DPO and KTO: where the reference model's log-probabilities come from. `adapter`: LoRA's "
        "base with the adapter disabled, in each step; `copy`: a frozen copy of the weights (full fine-tune), in each "
        "step; `precomputed`: once over the train rows before training, with no copy held, chosen when the copy "
        "does not fit; GRPO with `train.rl.kl_weight` above 0: `adapter` or `copy` (TRL has no precompute for "
        "sampled sequences)"
    )
    generation: Generation | None = Field(None, description="train.objective grpo: the generation phase")
    memory: Memory
    time: Time
    resources: Resources

    def to_json(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


class JobMemory(Section):
    """Predicted memory of a job after training, on one device."""

    weights_bytes: int = Field(description="the model's weights in the job's precision (one copy: LoRA's base is "
                               "scored with the adapter disabled, then enabled; a full model is loaded once at a time)")
    activations_bytes: int = Field(description="the largest batch's transient tensors beside the weights")
    breakdown_bytes: dict[str, int] = Field(
        description="evaluate: `scoring` (hidden states, attention scores, logits with their fp32 upcast), "
        "`generation` (the KV cache and the last position's logits), `lm_eval` (a batch at lm-eval's length); "
        "export: `merge` (the model merged in place) and `gguf` (the streaming GGUF writer's largest shard)"
    )
    peak_bytes_per_device: int = Field(description="weights (over the devices they are spread on) + activations")
    budget_bytes_per_device: int = Field(description="what one device offers (GPU memory, or host RAM × 0.9 − 680 MiB)")
    host_bytes: int = Field(description="predicted host memory of the job's process: on GPUs 1.5 GiB plus a copy of "
                            "the weights while loading; on the CPU 680 MiB plus the peak × what glibc keeps")


class JobTime(Section):
    """Predicted time of a job after training."""

    seconds: float = Field(description="the sum of `terms`")
    terms: dict[str, float] = Field(
        description="evaluate: `scoring` and `generation` (base and tuned: 2 FLOPs per parameter per token at the "
        "training throughput, plus each forward's ops), `loading`; export: `merge` (load and save) and `gguf_<type>`"
    )
    lm_eval_allowance_minutes: int | None = Field(
        None, description="lm-eval's time is not predicted (it depends on the tasks' documents): 20 minutes per task "
        "and model are added to `resources.runtime`"
    )


class JobResources(Section):
    """What the job asks the scheduler for (one node)."""

    gpus: int = Field(description="GPUs the weights are spread over (0: the CPU)")
    cpus: int = Field(description="`hardware.cpus`, else 8 per GPU, or the planning machine's cores")
    mem_mb: int = Field(description="`memory.host_bytes` × 1.25")
    runtime: int = Field(description="minutes: 1.5 × the predicted time + 10, plus the lm-eval allowance")


class JobPlan(Section):
    """plans/<recipe>/evaluate.json and plans/<recipe>/export.json: a job after training, placed and sized."""

    job: Literal["evaluate", "export"]
    accelerator: Literal["cpu", "cuda", "rocm"] = Field(description="where the job runs")
    device: str = Field(description="the GPU model, or `cpu`")
    devices: int = Field(description="GPUs the model is loaded on (0: the CPU)")
    device_map: Literal["cpu", "cuda", "auto"] = Field(
        description="how the weights are placed: `cuda` one GPU, `auto` spread over the node's GPUs by accelerate"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(description="the dtype the weights are loaded and run in")
    batch_size: int | None = Field(None, description="evaluate: sequences per forward pass and generation batch")
    lm_eval_batch_size: int | None = Field(None, description="evaluate with `eval.lm_eval`: lm-eval's batch size")
    reason: str = Field(description="the placement in words: why this device and precision")
    memory: JobMemory
    time: JobTime
    resources: JobResources

    def to_json(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


def write_plan(path: str | Path, plan: Plan | JobPlan) -> None:
    write_json(path, plan.to_json())


def read_plan(path: str | Path, model: type[Plan] | type[JobPlan] = Plan) -> Plan | JobPlan:
    """plan.json (or, with `model=JobPlan`, a job's plan), validated; a plan of another shape names the file and the
    fields at fault."""
    try:
        return model.model_validate(read_json(path))
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise XtrainError(f"{path}: not a plan this version of xtrain reads ({fields}); rerun the plan stage "
                          "(delete the file, or snakemake --forcerun plan)") from None
