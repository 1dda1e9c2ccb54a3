"""The jobs after training, placed and sized before any of them runs: evaluate (with lm-eval when the recipe asks)
-> plans/<recipe>/evaluate.json, and export (when the recipe asks) -> plans/<recipe>/export.json.

Each gets what plan.json gives the train job: the device and precision it runs on, memory per device and host
memory, a predicted time, and the resources its rule asks the scheduler for. They are files of their own, planned
by rules of their own (`plan_evaluate`, `plan_export`), not sections of plan.json: an edit to `eval:` or `export:`
then re-plans that job alone, and the checkpoint, which depends on plan.json, is not retrained.

Evaluate runs where the recipe trains: GPUs in the precision the plan chose for training, one loaded model at a
time (LoRA: the base once, scored with the adapter disabled and then enabled), spread over the node's GPUs
(accelerate's `device_map="auto"`) when one GPU cannot hold it. Export runs on the CPU: merging is a few
elementwise ops per layer and the GGUF writer streams files, so a GPU would wait on the disk.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import XtrainError
from ..recipe import Eval, Export, Hardware
from ..models.loading import DTYPES, config_dtype
from .memory import BYTES
from .planner import (
    CPU_PROCESS_BYTES, GIB, GPU_HOST_CPUS, GPU_PROCESS_BYTES, HOST_REQUEST_MARGIN, device_budget, reserved_bytes,
)
from .schema import JobPlan, Plan
from .generation import forward_seconds
from .speed import cpu_count, memory_bytes_per_second

# The evaluate job on a CPU: float32. On SmolLM2 (60 eval rows, LoRA on every linear layer) bf16 scored the tuned
# model's held-out loss within 0.19% of float32's but took as long (1,044 s against 1,049 s on a loaded 2-core
# machine) and changed 6 of 8 greedy answers (BENCHMARKS.md, "The evaluate job"), so the plan keeps float32 there.
CPU_EVAL_PRECISION = "fp32"
# What glibc's malloc keeps of an evaluation's freed activations across batch lengths (the evaluate job runs without
# the train job's preloaded allocator), per byte of the predicted peak: measured on the demo and SmolLM2.
EVAL_HOST_RETENTION = 1.3
# lm-evaluation-harness: its hf model pads requests up to this many tokens at most (its `max_length` default).
LM_EVAL_MAX_LENGTH = 2048
# lm-eval's time depends on its tasks' documents, which the plan does not read: an allowance per task and model.
LM_EVAL_MINUTES_PER_TASK = 20
# Reading and writing weights: safetensors load and save rates on a local disk (measured: BENCHMARKS.md, export).
DISK_BYTES_PER_SECOND = 300e6
# The export job's host memory over the model's bytes in its dtype (merge: base + adapter, merged in place) and over
# the largest merged shard (the streaming GGUF writer): issue 34's bounds, checked by bench/bench_export_memory.py.
MERGE_OVER_MODEL = 1.3
GGUF_OVER_SHARD = 1.5
# Quantizing or converting one GGUF file on the CPU (numpy, one core), bytes of input per second.
# Measured on the 1.1B bf16 model by bench/bench_export_memory.py (loaded machine): f16 ~80 MB/s, q8_0 ~40 MB/s.
GGUF_BYTES_PER_SECOND = {"f32": 150e6, "f16": 80e6, "bf16": 80e6, "q8_0": 40e6}


def model_config(model_dir: Path, trust_remote_code: bool) -> dict[str, int]:
    """What inference memory needs beyond plan.json's shape: attention heads, key/value heads, head size, context."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    heads = config.num_attention_heads
    return {"heads": heads, "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
            "max_positions": getattr(config, "max_position_embeddings", LM_EVAL_MAX_LENGTH)}


def forward_bytes(plan: Plan, shape: dict[str, int], precision: str, rows: int, tokens: int, logits: int) -> int:
    """Peak activation bytes of one no-grad forward over `rows` sequences of `tokens` tokens each, with `logits`
    positions' logits kept (all of them when scoring, the last one when generating): a layer's hidden states and
    MLP intermediates in the compute dtype, the attention scores of the math kernel in fp32, and the logits in the
    compute dtype, their fp32 upcast and the log-softmax."""
    width = BYTES[precision]
    model = plan.model
    layer = rows * tokens * (4 * model.hidden_size + 3 * model.intermediate_size) * width
    scores = rows * shape["heads"] * tokens * tokens * 4
    upcast = 4 if width != 4 else 0  # `.float()` copies 16-bit logits; float32 ones it returns as they are
    return layer + scores + rows * logits * model.vocab_size * (width + upcast + 4)


def kv_cache_bytes(plan: Plan, shape: dict[str, int], precision: str, rows: int, tokens: int) -> int:
    return rows * tokens * plan.model.layers * 2 * shape["kv_heads"] * shape["head_dim"] * BYTES[precision]


def plan_evaluate(plan: Plan, manifest: dict[str, Any], settings: Eval, hardware: Hardware, model_dir: Path,
                  trust_remote_code: bool = False) -> JobPlan:
    """Where the evaluate job runs, the batch it scores and generates with, its memory, time and resources."""
    shape = model_config(model_dir, trust_remote_code)
    split = manifest["splits"]["eval"]
    longest = min(split.get("max_len") or manifest["seq_len"], manifest["seq_len"])
    sequences = split["rows"] * split.get("sequences_per_row", 1)
    # Chats: eval.generations prompts answered by base and tuned, every sequence scored. GRPO's prompts: every one
    # answered (its rewards are the evaluation), nothing scored (a prompt has no reference answer). Preference
    # pairs: scored only.
    kind = manifest.get("data_kind", "chats")
    generations = {"chats": min(settings.generations, split["rows"]), "prompts": split["rows"]}.get(kind, 0)
    scored = kind != "prompts"
    gpu = hardware.accelerator != "cpu"
    precision = (plan.precision if plan.precision != "fp32" else plan.weights_dtype) if gpu else CPU_EVAL_PRECISION
    weights = plan.model.total * BYTES[precision]

    def activations(batch: int) -> dict[str, int]:
        score = forward_bytes(plan, shape, precision, batch, longest, longest) if scored else 0
        generate = (kv_cache_bytes(plan, shape, precision, batch, longest + settings.max_new_tokens)
                    + forward_bytes(plan, shape, precision, batch, longest, 1)) if generations else 0
        terms = {"scoring": score, "generation": generate}
        if settings.lm_eval:
            length = min(shape["max_positions"], LM_EVAL_MAX_LENGTH)
            terms["lm_eval"] = forward_bytes(plan, shape, precision, batch, length, length)
        return terms

    budget = device_budget(hardware.model_copy(update={"processes": 1}))
    # Batches are sized against one device holding all the weights; spread over more, each holds less.
    def fits(total: int) -> bool:
        return reserved_bytes(total, hardware) <= budget

    def own_batch(b: int) -> int:  # scoring or generation, whichever needs more (lm-eval batches on its own)
        terms = activations(b)
        return max(terms["scoring"], terms["generation"])

    batch, needed = fitting_batch(settings.batch_size, own_batch, fits, weights)
    lm_batch = (fitting_batch(batch, lambda b: activations(b)["lm_eval"], fits, weights)[0] if settings.lm_eval
                else None)
    terms = activations(batch)
    devices, device_map = 0, "cpu"
    if gpu:
        devices = math.ceil(reserved_bytes(weights + needed, hardware) / budget)
        if devices > hardware.gpus:
            raise XtrainError(
                f"evaluation needs {reserved_bytes(weights + needed, hardware) / GIB:.1f} GiB of GPU memory ({precision} "
                f"weights {weights / GIB:.1f} GiB, batch {batch}), more than the node's {hardware.gpus} x "
                f"{budget / GIB:.0f} GiB: lower eval.batch_size, or raise hardware.gpus or hardware.gpu_model")
        device_map = "cuda" if devices == 1 else "auto"
    elif weights + needed > budget:
        raise XtrainError(
            f"evaluation needs {(weights + needed) / GIB:.1f} GiB of host memory (fp32 weights {weights / GIB:.1f} "
            f"GiB at batch {batch}), more than the node's {budget / GIB:.1f} GiB usable: raise hardware.host_memory_gb "
            "or evaluate on GPUs (hardware.accelerator)")
    peak = weights // max(devices, 1) + needed
    # The evaluate job is one process on the node's cores (CPU) or GPUs: it reads weights at that device's rate.
    bandwidth = memory_bytes_per_second(hardware, plan.model.hidden_size, processes=1)
    seconds, time_terms = evaluate_seconds(plan, manifest, settings, sequences if scored else 0, generations, batch,
                                           weights, {"memory_bytes_per_second": bandwidth,
                                                     "accelerator": hardware.accelerator},
                                           kv_cache_bytes(plan, shape, precision, 1, 1))
    host = (GPU_PROCESS_BYTES + weights) if gpu else CPU_PROCESS_BYTES + peak * EVAL_HOST_RETENTION
    lm_minutes = LM_EVAL_MINUTES_PER_TASK * len(settings.lm_eval.tasks) * 2 if settings.lm_eval else 0
    reason = (f"on {devices} x {hardware.gpu} in {precision}, the training precision"
              + (" (the model does not fit one GPU: accelerate spreads it over the node's GPUs)" if devices > 1 else "")
              if gpu else f"on the CPU in {precision}, as the recipe trains"
              + (" (bf16 measured no faster there and changed greedy answers: BENCHMARKS.md)"
                 if precision == "fp32" else ""))
    if batch < settings.batch_size:
        reason += f"; batch {batch}, the largest of eval.batch_size {settings.batch_size} that fits"
    return JobPlan.model_validate({
        "job": "evaluate", "accelerator": hardware.accelerator, "device": hardware.gpu if gpu else "cpu",
        "devices": devices, "device_map": device_map, "precision": precision, "batch_size": batch,
        "lm_eval_batch_size": lm_batch, "reason": reason,
        "memory": {"weights_bytes": weights, "activations_bytes": needed, "breakdown_bytes": terms,
                   "peak_bytes_per_device": peak, "budget_bytes_per_device": budget, "host_bytes": int(host)},
        "time": {"seconds": round(seconds, 1), "terms": time_terms,
                 "lm_eval_allowance_minutes": lm_minutes if settings.lm_eval else None},
        "resources": job_resources(hardware, devices, host, seconds, lm_minutes),
    })


def fitting_batch(wanted: int, activations, fits, weights: int) -> tuple[int, int]:
    """The largest batch up to `wanted` (halving) whose activations `fits` beside the weights, and those bytes."""
    batch = wanted
    while batch > 1 and not fits(weights + activations(batch)):
        batch //= 2
    return batch, activations(batch)


def evaluate_seconds(plan: Plan, manifest: dict, settings: Eval, sequences: int, generations: int, batch: int,
                     weights: int, memory: dict, kv_bytes_per_token: int) -> tuple[float, dict[str, float]]:
    """Two models (base and tuned), each scoring the `sequences` scored (all of the eval split's, or none) and
    answering the generation prompts: forward FLOPs (2 per parameter per token) at the training throughput, plus the
    per-op cost of each forward pass; each greedy decode step also reads every weight and the batch's KV cache so far
    from memory at `memory["memory_bytes_per_second"]` (`generation.forward_seconds`: added on a CPU, overlapped on a
    GPU)."""
    split, time = manifest["splits"]["eval"], plan.time
    flops_per_token = 2 * plan.model.total
    # A forward pass dispatches about a third of a training micro-step's ops; without a trace, ~30 per layer.
    ops = time.ops_per_micro_step // 3 if time.ops_per_micro_step else 30 * plan.model.layers
    scoring = ((split["tokens"] * flops_per_token / time.device_flops + math.ceil(sequences / batch) * ops
                * time.op_seconds) if sequences else 0.0)
    mean_prompt = split["tokens"] / max(split["rows"] * split.get("sequences_per_row", 1), 1)
    batches = math.ceil(generations / batch) if generations else 0
    steps = batches * settings.max_new_tokens
    rates = {**memory, "matmul_flops": time.device_flops}
    # Prompts in one forward per batch; then per decode step each sequence's new token, at the mean context.
    prefill = sum(forward_seconds(rows * mean_prompt * flops_per_token / time.device_flops, weights, rates)
                  for rows in batch_rows(generations, batch))
    context = mean_prompt + settings.max_new_tokens / 2
    decode = settings.max_new_tokens * sum(
        forward_seconds(rows * flops_per_token / time.device_flops, weights + rows * context * kv_bytes_per_token, rates)
        for rows in batch_rows(generations, batch))
    generating = prefill + decode + (batches + steps) * ops * time.op_seconds
    loading = 2 * weights / DISK_BYTES_PER_SECOND
    terms = {"scoring": round(2 * scoring, 1), "generation": round(2 * generating, 1), "loading": round(loading, 1)}
    return sum(terms.values()), terms


def batch_rows(items: int, batch: int) -> list[int]:
    """The rows of each batch `items` make at `batch` a batch (the last one partial)."""
    return [min(batch, items - start) for start in range(0, items, batch)]


def plan_export(plan: Plan, settings: Export, hardware: Hardware, model_dir: Path,
                trust_remote_code: bool = False) -> JobPlan:
    """The export job: on the CPU, the merge in the base's dtype (or export.dtype), then each GGUF file streamed."""
    dtype = settings.dtype or config_dtype(model_dir, trust_remote_code)
    precision = {name: short for short, name in DTYPES.items()}[dtype]
    size = plan.model.total * BYTES[precision]
    shard = min(size, int(settings.shard_gb * 1e9))
    merge = MERGE_OVER_MODEL * size
    gguf = GGUF_OVER_SHARD * shard if settings.gguf else 0
    host = CPU_PROCESS_BYTES + max(merge, gguf)
    cpu_only = hardware.model_copy(update={"accelerator": "cpu", "gpus": 0, "processes": 1})
    budget = device_budget(cpu_only)
    # A GPU node's RAM is not known unless the recipe says it (hardware.host_memory_gb): the job asks, and Slurm
    # refuses what no node has; a CPU node is the planning machine's or the recipe's.
    if host > budget and (hardware.accelerator == "cpu" or hardware.host_memory_gb):
        raise XtrainError(f"the export needs {host / GIB:.1f} GiB of host memory ({dtype} model {size / GIB:.1f} GiB), "
                          f"more than the node's {budget / GIB:.1f} GiB usable: raise hardware.host_memory_gb, or set "
                          "export.dtype to a 16-bit dtype")
    terms = {"merge": round(2 * size / DISK_BYTES_PER_SECOND, 1),
             **{f"gguf_{kind}": round(size / GGUF_BYTES_PER_SECOND[kind] + size / DISK_BYTES_PER_SECOND, 1)
                for kind in settings.gguf}}
    seconds = sum(terms.values())
    reason = "on the CPU: merging is elementwise and the GGUF writer streams files, so a GPU would wait on the disk"
    return JobPlan.model_validate({
        "job": "export", "accelerator": "cpu", "device": "cpu", "devices": 0, "device_map": "cpu",
        "precision": precision, "reason": reason,
        "memory": {"weights_bytes": size, "activations_bytes": 0, "breakdown_bytes": {"merge": int(merge),
                                                                                      "gguf": int(gguf)},
                   "peak_bytes_per_device": int(max(merge, gguf)), "budget_bytes_per_device": budget,
                   "host_bytes": int(host)},
        "time": {"seconds": round(seconds, 1), "terms": terms},
        "resources": job_resources(cpu_only, 0, host, seconds, 0),
    })


def job_resources(hardware: Hardware, gpus: int, host: float, seconds: float, extra_minutes: int) -> dict[str, int]:
    return {"gpus": gpus, "cpus": (hardware.cpus or GPU_HOST_CPUS * gpus) if gpus else cpu_count(hardware),
            "mem_mb": math.ceil(host * HOST_REQUEST_MARGIN / 2**20),
            "runtime": math.ceil(seconds * 1.5 / 60) + 10 + extra_minutes}
