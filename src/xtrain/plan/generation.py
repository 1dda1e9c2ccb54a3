"""GRPO's generation phase (train.objective grpo): what sampling the completions holds and costs, beside the training
step on (prompt + completion) sequences.

What TRL 1.16's GRPOTrainer does (trl/trainer/grpo_trainer.py), and so what is counted here:
- once every `steps_per_generation` micro-steps (default: the gradient accumulation steps, so once per optimizer
  step) each device samples `micro-batch × steps_per_generation` completions with transformers' `generate` (KV cache
  on, under no_grad and outside autocast: the cache is in the weights' dtype), prompts left-padded to the longest;
- the KV cache of those sequences at their full length (prompt + `max_completion_length`): layers × 2 (keys and
  values) × key-value heads × head dim per token; beside it the last position's logits, their fp32 copy and the
  sampling probabilities, and the prompt's forward (prefill);
- the weights and AdamW states stay resident while it generates; gradients too when a generation falls inside an
  optimizer step (accumulation larger than steps_per_generation);
- with `beta` (train.rl.kl_weight) not 0 a reference model: for LoRA none is held (TRL disables the adapter), for a
  full fine-tune a frozen copy of the model loaded beside it in the policy's dtype (`Planner.estimate` adds it);
  either way one no-grad forward over each generated sequence (a third of a training micro-step), as a preference
  step's reference forward is counted;
- the policy's own log-probabilities in one more no-grad forward when the accumulation is not a multiple of
  steps_per_generation (generation and optimizer steps misaligned).
The training step itself is the traced step on rows of the longest prompt + max_completion_length tokens.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..recipe import Rl, Train
from .memory import BYTES, Step, torch_dtype
from .model import meta_model, transformers_model

# `generate`'s own ops per new token besides the model's forward (logits processors, sampling, stopping criteria,
# the cache position and attention-mask updates), sampling as GRPOTrainer configures it (no top-k, top-p 1): counted
# on real tensors by `bench/bench_grpo_plan.py ops` on the tiny model (transformers 5.24).
GENERATE_LOOP_OPS = 39
# What one op costs while generating, as a share of a training step's op (`time.op_seconds`): under no_grad nothing
# is recorded for autograd. Fitted with `bench/bench_grpo_plan.py decode` (one thread's CPU time, so the neighbours'
# load does not count): generate on the tiny model at 4 and 64 rows x 10 and 100 prompt tokens, LoRA at 32 x 60,
# 10-11 us per op against the probe's bare 5.0 us (a training op: 4 x 5.0 us), not on the GRPO steps it is checked on.
NO_GRAD_OP_SHARE = 0.55
# GRPOTrainer's own work around each generation batch and optimizer step, in ops of `time.op_seconds`: tokenizing
# the prompts, the reward calls, advantages and masks, and the step's metrics and logging (0.032 CPU s a step on the
# tiny model, of which `Trainer._maybe_log_save_evaluate` 0.027 with logging every step). Fitted on
# bench/bench_grpo_plan.py's `fit-full-kl0-c16` run (not one of the configurations it is checked on).
GRPO_STEP_OPS = 1600
# Bytes per position of the last token's logits while sampling: the logits in the weights' dtype, their fp32 copy,
# the processed scores and the probabilities (fp32 each).
SAMPLING_COPIES_FP32 = 3
# A reference or policy log-prob forward over a sequence: a third of a training micro-step (forward + backward).
SCORING_FORWARD = 1 / 3
# Sampling a token on a CPU: torch.multinomial over the vocabulary's probabilities, seconds per sequence and
# vocabulary entry (one thread on this 2-core EPYC: 5.7 ms for 16 x 16,384, 16.7 ms for 16 x 49,152: 21-22 ns), not
# an op's fixed cost: on SmolLM2 it is a tenth of a new token's time. On a GPU it is one kernel among the loop's ops.
CPU_SAMPLING_SECONDS_PER_LOGIT = 2.1e-8


@dataclass(frozen=True)
class Sampling:
    """One device's generation batch, as the layout sets it."""

    completions: int  # sequences generated at once on one device: micro-batch × steps_per_generation
    prompt_tokens: int  # the longest prompt (the batch is left-padded to it)
    completion_tokens: int  # train.rl.max_completion_length: sampled at worst to the end
    per_optimizer_step: float  # generations per optimizer step: accumulation / steps_per_generation
    realigned: bool  # accumulation is not a multiple of steps_per_generation: the policy's log-probs are recomputed

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def sampling(rl: Rl, micro_batch: int, accumulation: int, prompt_tokens: int) -> Sampling:
    steps_per_generation = rl.steps_per_generation or accumulation
    return Sampling(micro_batch * steps_per_generation, prompt_tokens, rl.max_completion_length,
                    accumulation / steps_per_generation, accumulation % steps_per_generation != 0)


class Heads(NamedTuple):
    """The model's attention, from its config.json."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int


@functools.lru_cache(maxsize=32)
def attention_shape(model_dir: str, trust_remote_code: bool) -> Heads:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code).get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Heads(config.num_hidden_layers, heads, kv_heads, head_dim)


def kv_cache_bytes(model_dir: Path, trust_remote_code: bool, batch: Sampling, weights_dtype: str) -> int:
    layers, _, kv_heads, head_dim = attention_shape(str(model_dir), trust_remote_code)
    return batch.completions * batch.tokens * layers * 2 * kv_heads * head_dim * BYTES[weights_dtype]


def generation_breakdown(training: dict[str, int], params: dict, train: Train, step: Step, batch: Sampling,
                         kv_cache: int) -> dict[str, int]:
    """Bytes on one device while it generates, by the training breakdown's keys plus `kv_cache`: the resident weights
    and AdamW states of `training` (the traced step's), gradients when a generation falls inside an optimizer step,
    and as `activations` the larger of the prefill's transients and the sampling's last-position logits."""
    width = BYTES[step.weights_dtype]
    prefill = batch.completions * batch.prompt_tokens * (4 * params["hidden_size"] + 3 * params["intermediate_size"]) * width
    logits = batch.completions * params["vocab_size"] * (width + 4 * SAMPLING_COPIES_FP32)
    gradient_bytes = 2 if train.method == "qlora" else 4
    mid_step = batch.per_optimizer_step > 1 or batch.realigned
    return {"weights": training["weights"], "gradients": params["trainable"] * gradient_bytes if mid_step else 0,
            "optimizer": training["optimizer"], "activations": max(prefill, logits), "workspace": 0,
            "kv_cache": kv_cache}


@dataclass(frozen=True)
class ForwardTrace:
    flops_per_token: float  # matmul FLOPs of one token's forward (attention over the context excluded)
    ops: int  # aten ops of one forward
    weight_bytes: int  # weights one decode forward reads: all of them, but of an untied input embedding only rows
    kv_bytes_per_token: int  # the KV cache of one token of context (all layers), read by each later token
    head_flops: int  # of `flops_per_token`, the output head's: `generate`'s prefill keeps one position's logits


def forward_trace(model_dir: Path, train: Train, weights_dtype: str, trust_remote_code: bool) -> ForwardTrace:
    lora = train.lora.model_dump_json() if train.adapters else None
    return _forward_trace(str(model_dir), "lora" if train.adapters else train.method, lora, weights_dtype,
                          trust_remote_code)


@functools.lru_cache(maxsize=32)
def _forward_trace(model_dir: str, method: str, lora: str | None, weights_dtype: str,
                   trust_remote_code: bool) -> ForwardTrace:
    """One decode step's forward on fake tensors, a new token per sequence after a cached prompt: its FLOPs and the
    aten ops it dispatches (the same modules run whatever the context length)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Counter(TorchDispatchMode):
        ops = flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # Fake tensors answer device queries (prim.device) that real ones never dispatch.
            self.ops += func.namespace != "prim"
            if func._overloadpacket in flop_registry:
                self.flops += flop_registry[func._overloadpacket](*args, **(kwargs or {}), out_val=out)
            return out

    train = Train(method=method, lora=json.loads(lora) if lora else None)
    model = meta_model(Path(model_dir), train, torch_dtype(weights_dtype), trust_remote_code)
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) - (
        embedding.numel() * embedding.element_size() if embedding is not head else 0)
    layers, _, kv_heads, head_dim = attention_shape(model_dir, trust_remote_code)
    rows = 2
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        model = model.to_empty(device="cpu").eval()
        prompt = model(input_ids=torch.zeros((rows, 4), dtype=torch.long), use_cache=True, logits_to_keep=1)
        # transformers 5 names the cache `cache` (`past_key_values` is deprecated); remote code may use the old name.
        name = "cache" if "cache" in inspect.signature(transformers_model(model).forward).parameters else "past_key_values"
        counter = Counter()
        with counter:
            model(input_ids=torch.zeros((rows, 1), dtype=torch.long), **{name: prompt[name]}, use_cache=True,
                  logits_to_keep=1)
    return ForwardTrace(counter.flops / rows, counter.ops, weight_bytes,
                        layers * 2 * kv_heads * head_dim * BYTES[weights_dtype], 2 * head.numel())


def forward_seconds(compute_seconds: float, bytes_read: float, rates: dict) -> float:
    """One no-grad forward that does `compute_seconds` of matmuls at the device's rate and reads `bytes_read` of weights
    and KV cache from memory. A GPU overlaps the two (the slower bounds it); one CPU core does not at a decode's
    shapes: one-row to 64-row matmuls over the 27M and SmolLM2-135M weights take the weights' bytes at the probed
    memory rate plus their FLOPs at the probed matmul rate, within 10% (BENCHMARKS.md, "GRPO: plan vs measured")."""
    memory_seconds = bytes_read / rates["memory_bytes_per_second"]
    if rates["accelerator"] == "cpu":
        return compute_seconds + memory_seconds
    return max(compute_seconds, memory_seconds)


def generation_seconds(trace: ForwardTrace, params: dict, batch: Sampling, rates: dict) -> float:
    """Seconds of one generation batch on one device: the prompts' forward (prefill), then one forward per new token
    with `generate`'s own ops, each attending over the context so far and reading every weight and the KV cache so
    far from memory (ops at their no-grad cost; on a CPU also the sampling over the vocabulary), and GRPOTrainer's
    own bookkeeping around the batch."""
    # Scores and values, 2 FLOPs each per context token and query width (taken as the model width), per layer.
    attention = 4 * params["layers"] * params["hidden_size"]
    op_seconds = rates["op_seconds"] * NO_GRAD_OP_SHARE
    prefill_tokens = batch.completions * batch.prompt_tokens
    # The prompt's forward computes the output head at its last position only (`logits_to_keep=1`).
    prefill_flops = (prefill_tokens * (trace.flops_per_token - trace.head_flops + attention * batch.prompt_tokens / 2)
                     + batch.completions * trace.head_flops)
    prefill = forward_seconds(prefill_flops / rates["matmul_flops"], trace.weight_bytes, rates) + trace.ops * op_seconds
    mean_context = batch.prompt_tokens + batch.completion_tokens / 2
    sampling = (batch.completions * params["vocab_size"] * CPU_SAMPLING_SECONDS_PER_LOGIT
                if rates["accelerator"] == "cpu" else 0.0)
    per_new_token = (forward_seconds(
        batch.completions * (trace.flops_per_token + attention * mean_context) / rates["matmul_flops"],
        trace.weight_bytes + batch.completions * mean_context * trace.kv_bytes_per_token, rates)
        + (trace.ops + GENERATE_LOOP_OPS) * op_seconds + sampling)
    return prefill + batch.completion_tokens * per_new_token + GRPO_STEP_OPS * rates["op_seconds"]
