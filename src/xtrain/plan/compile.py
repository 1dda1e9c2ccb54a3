"""Whether a run trains under `torch.compile`: the measured speed-up of a step against the compile's warm-up.

Inductor fuses a step's elementwise ops (on the CPU, bf16 autocast's per-pass weight casts above all), so it pays
where the step is made of many small ops, and only once the steps it speeds up have repaid its compile time. The
plan compiles when steps × (eager − compiled step) exceeds the warm-up, on a device and precision whose speed-up
has been measured (BENCHMARKS.md, "Compiled training"), for a backend that declares it compiles, and for a
supervised objective (a preference step's second, adapter-disabled forward would recompile the graph).

A compiled graph is specialised to its batch shape. Batches are padded to a multiple of `LENGTH_BUCKET` tokens, so
a run sees at most seq_len / 16 lengths; on the second shape dynamo recompiles once with a symbolic length, which
then serves every later one: a run whose rows are not all one length pays `RECOMPILES` compiles.
"""

from __future__ import annotations

import math

from .schema import Compile

# Step speed-up of inductor's default mode over eager through trl_cpu, per (device kind, autocast dtype, the train
# job's allocator), on the 27M Llama, batch 4 x 512 (BENCHMARKS.md, "Compiled training and the settings grid"):
# compiling saves allocations, so it gains less where TCMalloc already makes them cheap. fp32: a hand-written loop's.
# The lock's mimalloc (with allocator.OPTIONS), bf16: 0.97, trl_cpu compiled against eager on the 27M LoRA and full
# rows of bench_trl_throughput.py, the same morning (BENCHMARKS.md, "The allocator from the lock").
# Unmeasured combinations (jemalloc, every GPU) stay eager: with no entry, `decide` plans eager and says the
# speed-up is not measured, rather than borrowing another allocator's.
SPEEDUP = {("cpu", "bf16", "glibc"): 1.20, ("cpu", "bf16", "tcmalloc"): 1.10, ("cpu", "bf16", "mimalloc"): 0.97,
           ("cpu", "fp32", "glibc"): 0.92, ("cpu", "fp32", "tcmalloc"): 0.99}
# Compile seconds per aten op the step dispatches (the trace's count), measured as the first step's extra time in
# bench_trl_throughput.py: 10.6 s for the 27M LoRA step's 7,348 ops, 8-14.5 s for the full step's 5,404.
SECONDS_PER_OP = 0.002
LENGTH_BUCKET = 16  # tokens: compiled batches are padded up to a multiple of it (half of it per row on average)
RECOMPILES = 2  # the first shape's graph, then one with a symbolic length


def batch_shapes(longest: int, mean_len: float) -> int:
    """Distinct padded batch lengths a compiled run can see: one when every row is as long as the longest."""
    return 1 if mean_len >= longest else math.ceil(longest / LENGTH_BUCKET)


def padding(shapes: int, mean_len: float) -> float:
    """Tokens a compiled batch computes per token it holds: rows rounded up to the bucket, half a bucket on average."""
    return 1.0 if shapes == 1 else 1 + LENGTH_BUCKET / 2 / mean_len


def decide(device: str, precision: str, memory_allocator: str, objective: str, backend: str, backend_compiles: bool,
           micro_steps: int, micro_seconds: float, ops: int, shapes: int, mean_len: float) -> Compile:
    """Compile or not, for `micro_steps` forward+backward passes of `micro_seconds` each (eager) and `ops` ops."""
    speedup = SPEEDUP.get((device, precision, memory_allocator if device == "cpu" else None))
    where = f"{device} in {precision}" + (f" under {memory_allocator}" if device == "cpu" else "")
    warmup = SECONDS_PER_OP * ops * min(shapes, RECOMPILES)
    saved = micro_steps * micro_seconds * (1 - padding(shapes, mean_len) / speedup) if speedup else 0.0
    if not backend_compiles:
        reason = f"train.backend {backend} does not compile through xtrain"
    elif objective != "sft":
        reason = f"train.objective {objective}: compiled preference steps are not measured"
    elif speedup is None:
        reason = f"torch.compile's speed-up on {where} is not measured"
    elif speedup <= 1:
        reason = f"a compiled step on {where} measured {speedup:.2f}x: slower than eager"
    elif not ops:
        reason = "the step was not traced (analytical estimator): its compile time is unknown"
    elif saved <= warmup:
        reason = (f"the {speedup:.2f}x step would save {saved:.0f} s over {micro_steps} micro-steps, "
                  f"not more than the {warmup:.0f} s compile")
    else:
        reason = f"the {speedup:.2f}x step saves {saved:.0f} s over {micro_steps} micro-steps, for a {warmup:.0f} s compile"
        return Compile(mode="default", speedup=speedup, warmup_seconds=round(warmup, 1), batch_shapes=shapes,
                       pad_to_multiple_of=LENGTH_BUCKET if shapes > 1 else None, reason=reason)
    return Compile(mode=None, speedup=speedup, warmup_seconds=0.0, batch_shapes=shapes, pad_to_multiple_of=None,
                   reason="eager: " + reason)
