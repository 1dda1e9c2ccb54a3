"""Which attention a CPU training step runs: transformers' default (torch's fused SDPA kernel) or its eager
attention (matmul, softmax, matmul), whichever this machine measures faster at the run's shape.

On the CPU the fused kernel is not always the faster: on this 2-core EPYC (bf16, LoRA, BENCHMARKS.md, "Attention on
the CPU") eager trained the 27M Llama's rows of 256 and 512 tokens 6-9% and 9-14% faster and SmolLM2-135M's 10-14%
and 11-17%, both models' rows of 1,024 about as fast, and of 2,048 5-20% slower. Eager holds each layer's attention
probabilities (rows × heads × length²) for the backward, so memory decides too: the planner takes eager only where its
traced step fits.

The probe times one layer's attention forward, and forward with backward, under each implementation, with
transformers' own attention functions on random query, key and value tensors of the run's shape (micro-batch rows,
heads, key-value heads, head dimension, length) in its precision, best of five windows, in a process under the
allocator the train job gets: eager allocates each layer's length² scores anew, and glibc, which returns such blocks
to the system at every free, made it read 2-5x slower than the train job then ran it. It is
measured once per machine, thread count, torch version, allocator and shape and recorded beside the CPU probe
(`$XDG_CACHE_HOME/xtrain/cpu-attention.json`), so a plan made twice is the same plan. Delete the file to measure
again. `XTRAIN_CPU_ATTENTION="<sdpa forward>,<sdpa backward>,<eager forward>,<eager backward>"` (seconds per layer)
gives fixed figures for every shape instead; under `XTRAIN_CPU_PROBE` without it (fixed figures for another machine,
as the tests plan) nothing is measured and the model's default stays.

The lengths: where the backend sends rows length-grouped, each batch is about as long as its rows, and attention's
cost grows with the square of a batch's length; the probe measures each of LENGTH_SHARES equal shares of the trained
rows at its root-mean-square length (from the split's length histogram) and takes the mean over the shares, so a
long tail of rows, where eager is slower, counts. Otherwise it measures at the trained rows' mean length.

The plan's step time keeps the default's trace (which the CPU rates were fitted on) and adds the measured
difference: (eager − default) per layer, the forward counted twice under gradient checkpointing.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from ..errors import XtrainError
from .probe import FIXED, cache_file, cpu_name, read_cache, seconds_per_call, significant, write_cache
from .generation import Heads
from .schema import Attention

CACHE = "cpu-attention.json"
FIXED_ATTENTION = "XTRAIN_CPU_ATTENTION"
WINDOW_SECONDS = 0.05  # per window, five windows per figure
LENGTH_SHARES = 3  # length-grouped rows are measured at this many lengths, each an equal share of them


class Shape(NamedTuple):
    """One layer's attention in a micro-step."""

    rows: int
    heads: int
    kv_heads: int
    head_dim: int
    length: int
    precision: str


class Seconds(NamedTuple):
    """One layer's attention under one implementation: its forward, and its backward."""

    forward: float
    backward: float

    def micro_step(self, layers: int, checkpointing: bool) -> float:
        """Seconds of a micro-step's attention over every layer (the forward again under checkpointing)."""
        return layers * (self.forward * (2 if checkpointing else 1) + self.backward)


def shape(heads: Heads, rows: int, length: float, precision: str) -> Shape:
    """The attention shape of `rows` rows of `length` tokens for the model's heads (`generation.attention_shape`)."""
    return Shape(rows, heads.heads, heads.kv_heads, heads.head_dim, max(1, round(length)), precision)


def ruled_out(why: str) -> tuple[Attention, float]:
    """The model's default, for a step the choice does not apply to (`why`: the device, the backend, packing...)."""
    return Attention(implementation=None, reason=f"the model's default: {why}"), 0.0


def decide(shapes: list[Shape], layers: int, checkpointing: bool, cpus: int) -> tuple[Attention, float]:
    """The implementation the micro-steps of these shapes (one length each, an equal share of the steps) train with,
    and its mean seconds a micro-step over the default's (0 or less)."""
    if os.environ.get(FIXED) and not os.environ.get(FIXED_ATTENTION):
        return ruled_out(f"{FIXED} gives fixed probe figures and {FIXED_ATTENTION} none: attention is not measured")
    fixed = os.environ.get(FIXED_ATTENTION)
    measured = [fixed_seconds(fixed) if fixed else cached_seconds(shape, cpus) for shape in shapes]
    default, eager = (sum(Seconds(*figures[kind]).micro_step(layers, checkpointing) for figures in measured)
                      / len(shapes) for kind in ("sdpa", "eager"))
    figures = {"default_seconds": round(default, 4), "eager_seconds": round(eager, 4)}
    shape = shapes[0]
    lengths = " / ".join(str(shape.length) for shape in shapes)
    where = (f"{shape.rows} rows of {lengths} tokens{', a share of the steps each' if len(shapes) > 1 else ''}, "
             f"{shape.heads} heads ({shape.kv_heads} key-value) of {shape.head_dim}, {shape.precision}, "
             f"{layers} layers")
    if eager < default:
        reason = f"eager: {eager:.3f} s against sdpa's {default:.3f} s a micro-step ({where})"
        return Attention(implementation="eager", **figures, reason=reason), eager - default
    reason = f"the model's default: sdpa {default:.3f} s against eager's {eager:.3f} s a micro-step ({where})"
    return Attention(implementation=None, **figures, reason=reason), 0.0


def fixed_seconds(text: str) -> dict[str, list[float]]:
    """XTRAIN_CPU_ATTENTION's figures."""
    try:
        figures = [float(part) for part in text.split(",")]
        if len(figures) != 4:
            raise ValueError
    except ValueError:
        raise SystemExit(f"{FIXED_ATTENTION}={text!r}: give '<sdpa forward>,<sdpa backward>,<eager forward>,<eager "
                         "backward>' in seconds per layer, e.g. 0.014,0.024,0.009,0.013") from None
    return {"sdpa": figures[:2], "eager": figures[2:]}


def cached_seconds(shape: Shape, cpus: int) -> dict[str, list[float]]:
    """The recorded forward and backward seconds of each implementation at this shape, measured the first time."""
    import torch

    from ..train import allocator

    key = (f"{cpu_name()}|{cpus} threads|torch {torch.__version__}|{allocator.for_train_job()}|"
           + "|".join(f"{name} {value}" for name, value in shape._asdict().items()))
    path = cache_file(CACHE)
    entries = read_cache(path)
    if key not in entries:
        entries[key] = {kind: [significant(s) for s in seconds] for kind, seconds in measured(shape, cpus).items()}
        write_cache(entries, path)
    return entries[key]


def measured(shape: Shape, cpus: int) -> dict[str, list[float]]:
    """`measure` in a process under the train job's allocator (`python -m xtrain.plan.attention`)."""
    from ..train import allocator

    env = dict(os.environ)
    if not env.get("LD_PRELOAD"):  # the user's own preload is what the train job runs under too
        env |= allocator.train_job_variables()
    probe = subprocess.run([sys.executable, "-m", "xtrain.plan.attention", json.dumps(shape._asdict()), str(cpus)],
                           env=env, capture_output=True, text=True)
    if probe.returncode:
        raise XtrainError(f"the CPU attention probe failed for {shape}:\n{probe.stderr[-2000:]}")
    return json.loads(probe.stdout.strip().splitlines()[-1])


def measure(shape: Shape, cpus: int) -> dict[str, Seconds]:
    """Best-of-five seconds of one layer's attention forward, and of its backward, under sdpa and eager."""
    import torch
    from transformers import masking_utils
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from .memory import torch_dtype

    class Layer(torch.nn.Module):  # what transformers' attention functions read from the attention module
        is_causal = True
        num_key_value_groups = shape.heads // shape.kv_heads

    layer, dtype, threads = Layer().train(), torch_dtype(shape.precision), torch.get_num_threads()
    tensors = [torch.randn(shape.rows, heads, shape.length, shape.head_dim, dtype=dtype, requires_grad=True)
               for heads in (shape.heads, shape.kv_heads, shape.kv_heads)]
    # Eager gets transformers' additive causal mask, in the dtype of the fp32 weights the CPU trains with; sdpa on an
    # unpadded batch gets none and runs causal.
    mask = masking_utils.eager_mask(shape.rows, shape.length, shape.length, dtype=torch.float32)
    scaling = shape.head_dim ** -0.5
    attend = {"sdpa": lambda: sdpa_attention_forward(layer, *tensors, None, scaling=scaling)[0],
              "eager": lambda: eager_attention_forward(layer, *tensors, mask, scaling=scaling)[0]}
    torch.set_num_threads(cpus)
    try:
        figures = {}
        for kind, forward in attend.items():
            def both():
                forward().sum().backward()

            seconds = {name: min(seconds_per_call(fn, WINDOW_SECONDS) for _ in range(5))
                       for name, fn in (("forward", forward), ("both", both))}
            figures[kind] = Seconds(seconds["forward"], max(0.0, seconds["both"] - seconds["forward"]))
        return figures
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=8)
def default_attention(model_dir: str, trust_remote_code: bool) -> str:
    """The attention transformers gives the model by default ("sdpa" where its class supports torch's kernel)."""
    from ..recipe import Train
    from .model import meta_model

    model = meta_model(Path(model_dir), Train(method="full"), trust_remote_code=trust_remote_code)
    return model.config._attn_implementation

if __name__ == "__main__":  # one measurement, in the train job's environment (`measured`)
    arguments = json.loads(sys.argv[1])
    print(json.dumps(measure(Shape(**arguments), int(sys.argv[2]))))
