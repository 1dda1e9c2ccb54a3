"""Peak memory of one training step on one device, by two estimators with the same breakdown.

`traced` runs one real step of the model (forward, backward, AdamW step, with AdamW's states already
made, as in every step after a run's first) on fake tensors: PyTorch's FakeTensorMode gives every op its
true output shape and dtype without allocating, and `torch.distributed._tools.mem_tracker.MemTracker` sorts
live tensors into weights, gradients, optimizer states, activations and workspace and keeps the peak. The same
pass counts the step's FLOPs (`torch.utils.flop_counter`'s formulas) and dispatched ops, which the time prediction uses.
`analytical` is the closed formula (weights + trainable × optimizer bytes + per-layer activations +
logits); it needs no model code and is the fallback and the cross-check.

Both describe the device the plan targets, not the machine running the plan: GPU steps are traced on
CPU fakes with the GPU's precision. AdamW is torch's fused kernel, as every backend runs it
(`train.backends.contract.ADAMW`).

A trace's cost grows with the model's depth (80 layers for a 70B), so a deep model whose decoder layers are identical
copies is traced at two shallow depths and its figures extrapolated, exactly, in the layer count (`extrapolated`).
"""

from __future__ import annotations

import functools
import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from unittest import mock

from ..recipe import Train
from .model import decoder_layers, layer_signature, layer_stack, meta_model, transformers_model

log = logging.getLogger(__name__)

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
BREAKDOWN_KEYS = ("weights", "gradients", "optimizer", "activations", "workspace")


@dataclass(frozen=True)
class Step:
    """One training step as the plan lays it out on one device."""

    micro_batch: int
    seq_len: int
    precision: str  # autocast dtype: fp32 (no autocast), bf16 or fp16
    weights_dtype: str  # dtype the frozen weights are held in; trainable ones are always fp32
    checkpointing: bool
    sequences: int = 1  # sequences per row: a DPO pair is two (prompt + chosen, prompt + rejected) in one batch
    # Packed rows train padding-free: a micro-batch is one sequence of rows x seq_len tokens whose attention is masked
    # block by block, so attention spans the whole flattened length.
    packed: bool = False
    # Gradient accumulation: every micro-step after an optimizer step's first runs with the gradients summed so far
    # held (a full fine-tune's are as large as its weights), so the step traced is such a micro-step.
    accumulating: bool = False
    attention: str | None = None  # the attn_implementation the model is built with (plan.attention); None: its default

    @property
    def rows(self) -> int:
        """Sequences in one forward pass."""
        return self.micro_batch * self.sequences


class Trace(NamedTuple):
    breakdown: dict[str, int]  # bytes at the peak, by BREAKDOWN_KEYS
    flops: int  # FLOPs of one step, recomputation included
    ops: int  # aten ops dispatched in one step
    # Bytes at each segment's peak (the step's peak is one of them), by BREAKDOWN_KEYS: sharding shrinks some kinds
    # and not others, so a sharded step's peak can be another segment's (Planner.training_breakdown).
    phases: tuple[dict[str, int], ...] = ()


# MemTracker's reference types, folded into the plan's breakdown.
REFTYPE_TO_KEY = {"Parameter": "weights", "Buffer": "weights", "Gradient": "gradients", "Optstate": "optimizer",
                  "Activation": "activations", "Other": "activations", "Temp": "workspace"}


# Depths of the shallow copies a deep model is traced at: two, so that each phase of the step has a first and a last
# layer (the ends of a stack whose memory grows by the same amount per layer), a layer apart, so that the per-layer
# increments are whole bytes, ops and FLOPs.
SHALLOW = (2, 3)


class Run(NamedTuple):
    """One traced step and its segments' peaks: (phase, where in the layer stack) -> the snapshot
    (MemTracker's reference types and "Total") at the segment's peak, in the order the segments began."""

    trace: Trace
    segments: dict[tuple, dict]
    signature: tuple | None  # the first decoder layer's layer_signature


def traced(model_dir: Path, train: Train, step: Step, trust_remote_code: bool = False,
           params: dict | None = None) -> Trace:
    """The traced step. QLoRA's is LoRA's traced with the base in `step.weights_dtype`, its 4-bit storage then
    counted by `quantized` (bitsandbytes' layers do not run on fake tensors): `params` must carry the counts."""
    lora = train.lora.model_dump_json() if train.adapters else None
    trace = depth_traced(str(model_dir), "lora" if train.adapters else train.method, lora, step, trust_remote_code)
    if train.method != "qlora":
        return trace
    return trace._replace(breakdown=quantized(trace.breakdown, params, train, step),
                          phases=tuple(quantized(phase, params, train, step) for phase in trace.phases))


def depth_traced(model_dir: str, method: str, lora: str | None, step: Step, trust_remote_code: bool) -> Trace:
    """The step of the whole model: extrapolated from shallow copies where that is exact and cheaper, else traced."""
    stack = layer_stack(model_dir, method, lora, trust_remote_code)
    if stack.depth <= sum(SHALLOW):  # the shallow copies together would be as deep as the model
        return _traced(model_dir, method, lora, step, trust_remote_code).trace
    if stack.differs:
        log_full_trace(model_dir, stack.differs)
        return _traced(model_dir, method, lora, step, trust_remote_code).trace
    runs = [_traced(model_dir, method, lora, step, trust_remote_code, layers) for layers in SHALLOW]
    if any(run.signature != stack.signature for run in runs):
        log_full_trace(model_dir, "a shallow copy's decoder layer differs from the model's")
        return _traced(model_dir, method, lora, step, trust_remote_code).trace
    trace = extrapolated(runs, stack.depth)
    if trace is None:
        log_full_trace(model_dir, "the shallow copies' steps differ in more than their depth")
        return _traced(model_dir, method, lora, step, trust_remote_code).trace
    return trace


@functools.lru_cache(maxsize=32)  # once per model
def log_full_trace(model_dir: str, reason: str) -> None:
    log.info("%s: tracing every decoder layer (%s): the per-layer extrapolation would not be exact", model_dir, reason)


def extrapolated(runs: list[Run], depth: int) -> Trace | None:
    """The step of a `depth`-layer model from steps of its shallow copies (`SHALLOW`), or None where the copies'
    segments do not match one to one.

    FLOPs and ops grow by the same amount with each identical layer. Memory does within each segment of the step (a
    phase's prologue, its first and its last layer with what follows each up to the next layer): weights, gradients
    and optimizer states by a layer's share, saved activations by one layer's, at every op of the segment alike, so
    each segment's peak sits at the same op at every depth and its bytes, by type, are linear in the depth. A middle
    layer's segment lies between the first's and the last's (it holds the activations or gradients of the layers
    before it, a layer's worth each), so the step's peak is the largest of the extrapolated segment peaks."""
    (shallow, a), (deeper, b) = zip(SHALLOW, runs, strict=True)
    ends = [{key: snap for key, snap in run.segments.items() if key[-1] != "middle"} for run in (a, b)]
    if list(ends[0]) != list(ends[1]):
        return None

    def grow(x: int, y: int) -> int:  # whole increments: SHALLOW's depths are a layer apart
        return x + (y - x) * (depth - shallow) // (deeper - shallow)

    segments = [{kind: grow(value, ends[1][key][kind]) for kind, value in snap.items()}
                for key, snap in ends[0].items()]
    if any(value < 0 for snap in segments for value in snap.values()):
        return None
    peak = max(segments, key=lambda snap: snap["Total"])  # the first of equal peaks, as the tracker keeps it
    return Trace(fold(peak), grow(a.trace.flops, b.trace.flops), grow(a.trace.ops, b.trace.ops),
                 tuple(fold(snap) for snap in segments))


@functools.lru_cache(maxsize=256)  # the layout search and the "does not fit" advice revisit steps
def _traced(model_dir: str, method: str, lora: str | None, step: Step, trust_remote_code: bool,
            layers: int | None = None) -> Run:
    """One step of the model, or of its first `layers` decoder layers."""
    import torch
    import transformers.masking_utils
    from torch._subclasses.fake_tensor import FakeTensorMode

    train = Train(method=method, lora=json.loads(lora) if lora else None)
    model = meta_model(Path(model_dir), train, torch_dtype(step.weights_dtype), trust_remote_code, layers,
                       step.attention)
    blocks = decoder_layers(model)
    # Fake tensors look like tracing to transformers, which then builds a 4-D causal mask a real
    # unpacked batch never materialises; saying "not packed" keeps the real run's mask-free path.
    # A packed micro-batch is one row whose position ids restart at each packed row; the real tensor of which row each
    # token belongs to is handed over, as transformers' own search through the ids cannot run on fake tensors.
    row_of_token = torch.arange(step.rows).repeat_interleave(step.seq_len)[None] if step.packed else None
    packing = mock.patch.object(transformers.masking_utils, "find_packed_sequence_indices", lambda *a, **k: row_of_token)
    with FakeTensorMode(allow_non_fake_inputs=True), packing:
        model = model.to_empty(device="cpu")  # peft cannot wrap a fake model, so it is built on meta first
        transformers_model(model).tie_weights()  # to_empty unties shared storage
        if step.checkpointing:
            model.activation_checkpointing_enable()
        if method != "full" and step.checkpointing:
            model.enable_input_require_grads()  # as the HF Trainer does for adapters under checkpointing
        model.train()
        ids = torch.zeros((1, step.rows * step.seq_len) if step.packed else (step.rows, step.seq_len), dtype=torch.long)
        positions = {"position_ids": torch.arange(step.seq_len).repeat(step.rows)[None]} if step.packed else {}
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, fused=True)
        # The steady state is a step with AdamW's states held throughout. AdamW makes them at its first step, so an
        # untraced step on zero gradients makes them here. Tracing two steps instead took twice as long, and counted
        # a tensor the tracker keeps from the first (one hidden state per row; no real step holds it).
        for param in trainable:
            param.grad = torch.zeros_like(param)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step.accumulating:  # the earlier micro-steps' gradients, which this one's are added to
            for param in trainable:
                param.grad = torch.zeros_like(param)
        autocast = (nullcontext() if step.precision == "fp32"
                    else torch.autocast("cpu", dtype=torch_dtype(step.precision)))
        tracker = TrainableMemTracker(blocks)
        tracker.track_external(model, optimizer)
        with tracker:
            tracker.enter("forward")
            with autocast:
                loss = model(input_ids=ids, labels=ids, use_cache=False, **positions).loss
            tracker.enter("backward")
            loss.backward()
            tracker.enter("optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    return Run(Trace(fold(peak), tracker.flops, tracker.ops, tuple(fold(snap) for snap in tracker.segments.values())),
               tracker.segments,
               layer_signature(blocks[0]) if blocks else None)


def peak_breakdown(tracker) -> dict[str, int]:
    """A MemTracker's peak bytes, summed into the plan's breakdown keys."""
    return fold(next(iter(tracker.get_tracker_snapshot("peak").values())))


def fold(snapshot: dict) -> dict[str, int]:
    """A MemTracker snapshot (bytes by reference type) summed into the plan's breakdown keys."""
    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0)
    for reftype, key in REFTYPE_TO_KEY.items():
        breakdown[key] += snapshot[next(r for r in snapshot if getattr(r, "value", r) == reftype)]
    return breakdown


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _tracker_class():
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

    # The CPU's fused attention, which torch's formulas leave out: (query, key, value, dropout, is_causal) forward,
    # (grad, query, key, value, out, logsumexp, dropout, is_causal) backward. The causal kernel skips the blocks above
    # the diagonal (half the work); a masked one (packed rows) computes every block.
    aten = torch.ops.aten
    cpu_attention = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, _dropout=0.0, causal=False, *_: (
            sdpa_flop_count(q.shape, k.shape, v.shape) // (2 if causal else 1)),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda grad, q, k, v, _out, _lse, _dropout=0.0,
        causal=False, *_: sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape) // (2 if causal else 1),
    }

    class GlobalPeakMemTracker(MemTracker):
        """MemTracker that hooks only trainable parameters, keeps only the global peak and each segment's, counts
        ops and FLOPs.

        The stock tracker registers a gradient hook on every parameter, which fails on frozen (LoRA base)
        ones, and refreshes every module's peak on every op, which makes a large model's trace 4-20x slower.
        FLOPs use torch's own per-op formulas (and theirs for the CPU's fused attention, which they leave out);
        FlopCounterMode itself keeps tensors alive and would inflate the peak it runs beside.
        A segment is a stretch of one phase of the step (`enter`): before the decoder layers, or from the start
        of the first, a middle or the last layer (in the forward or backward order) to the start of the next, or to
        the phase's end (a layer's start: its forward pre-hook in the forward, its backward pre-hook in the backward,
        not a checkpoint's recompute; the post-hooks of one layer and the pre-hooks of the next fire in either order);
        `extrapolated` matches them across depths.
        """

        ops = flops = 0

        def __init__(self, blocks=()):
            super().__init__()
            self.layer_index = {id(block): index for index, block in enumerate(blocks)}
            self.segments: dict[tuple, dict] = {}
            self.phase, self.where = None, ("before", None)

        def enter(self, phase: str) -> None:
            self.phase, self.where = phase, ("before", None)

        def _enter_layer(self, module, backward: bool) -> None:
            index = self.layer_index.get(id(module))
            if index is not None and (self.phase == "backward") == backward:  # not a checkpoint's recompute
                last = len(self.layer_index) - 1
                self.where = ("from", "first" if index == 0 else "last" if index == last else "middle")

        def _pre_fw_hook(self, module, inputs):
            super()._pre_fw_hook(module, inputs)
            self._enter_layer(module, backward=False)

        def _pre_bw_hook(self, module, args):
            super()._pre_bw_hook(module, args)
            self._enter_layer(module, backward=True)

        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            def track_grad(grad):
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            param_bytes = buffer_bytes = 0
            for param in module.parameters():
                infos = self._update_and_maybe_create_winfos(param, _MemRefType.PARAM)
                param_bytes += sum(info.mem_consumed for info in infos)
                if param.grad is not None:  # accumulated before tracking began
                    self._update_and_maybe_create_winfos(param.grad, _MemRefType.GRAD)
                if install_grad_hooks and param.requires_grad and param not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(lambda grad: track_grad(grad)),
                        param.register_post_accumulate_grad_hook(lambda p: track_grad(p.grad)),
                    )
            for buffer in module.buffers():
                buffer_bytes += sum(i.mem_consumed for i in self._update_and_maybe_create_winfos(buffer, _MemRefType.BUFFER))
            return param_bytes, buffer_bytes

        def _update_peak_stats(self, peak_state):
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot["Total"]:
                    self._peak_mem[device] = snapshot["Total"]
                    self._peak_mem_snap[device] = dict(snapshot)
                key = (self.phase, *self.where)
                if key not in self.segments or self.segments[key]["Total"] < snapshot["Total"]:
                    self.segments[key] = dict(snapshot)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            self.ops += 1
            if func._overloadpacket in flop_registry:
                self.flops += flop_registry[func._overloadpacket](*args, **(kwargs or {}), out_val=out)
            elif func._overloadpacket in cpu_attention:
                self.flops += cpu_attention[func._overloadpacket](*args)
            return out

    return GlobalPeakMemTracker


def TrainableMemTracker(blocks=()):  # noqa: N802 (a class, built on first use so importing the plan stays light)
    """The tracker; `blocks`: the model's decoder layers, in order, which delimit its segments."""
    return _tracker_class()(blocks)


# Bytes per token and per layer saved for backward by a Llama-style block (attention + SwiGLU MLP), as
# c_hidden·hidden + c_mlp·intermediate, measured by tracing one- and two-layer models (FIELD-NOTES:
# the textbook 34·h misses SwiGLU, fp32 norms and PEFT's fp32 copy of each adapted layer's input).
ACTIVATION_COEFFICIENTS = {  # (method, 16-bit autocast) -> (c_hidden, c_mlp)
    ("full", False): (40, 16), ("full", True): (34, 8),
    ("lora", False): (28.6, 12), ("lora", True): (32.8, 12),
}


# Bytes per weight of a 4-bit layer (bitsandbytes): two weights per byte, one absmax per block of 64 weights (fp32;
# with double quantization uint8, plus one fp32 scale per 256 of those blocks).
QUANT_BLOCK, DOUBLE_QUANT_BLOCK = 64, 256
# Bytes per trainable parameter of a QLoRA run as TRL trains it: it casts the adapters (and modules_to_save) of a
# quantized model to bf16, so AdamW keeps its two states in bf16 as well (weights, gradients, optimizer).
QLORA_TRAINABLE = {"weights": 2, "gradients": 2, "optimizer": 4}


def four_bit_bytes(double_quant: bool) -> float:
    """Bytes per weight of a 4-bit base layer, its quantization constants included."""
    constants = (1 + 4 / DOUBLE_QUANT_BLOCK) if double_quant else 4
    return 0.5 + constants / QUANT_BLOCK


def quantized(breakdown: dict[str, int], params: dict, train: Train, step: Step) -> dict[str, int]:
    """A LoRA step's breakdown (base in `step.weights_dtype`, adapters in fp32) as QLoRA runs it: the base's linear
    layers at 4 bits plus constants, one layer at a time dequantized to the compute dtype (workspace), and the
    trainable parameters, their gradients and AdamW states in bf16."""
    linear, largest, trainable = params["quantized"], params["largest_quantized"], params["trainable"]
    weights = (breakdown["weights"] - linear * BYTES[step.weights_dtype] + linear * four_bit_bytes(train.quantization.double_quant)
               - trainable * (4 - QLORA_TRAINABLE["weights"]))
    return {
        **breakdown,
        "weights": int(weights),
        "gradients": breakdown["gradients"] * QLORA_TRAINABLE["gradients"] // 4,
        "optimizer": breakdown["optimizer"] * QLORA_TRAINABLE["optimizer"] // 8,
        "workspace": breakdown["workspace"] + largest * BYTES[step.precision],
    }


def analytical(params: dict, method: str, step: Step, train: Train | None = None) -> dict[str, int]:
    """Closed-form peak bytes by the same breakdown as `traced` (`train`: the quantization, for method qlora)."""
    if method == "qlora":
        return quantized(analytical(params, "lora", step), params, train, step)
    half = step.precision != "fp32"
    trainable, frozen = params["trainable"], params["total"] - params["trainable"]
    h, inter, layers, vocab = params["hidden_size"], params["intermediate_size"], params["layers"], params["vocab_size"]
    tokens = step.rows * step.seq_len
    c_hidden, c_mlp = ACTIVATION_COEFFICIENTS[(method, half)]
    layer = tokens * (c_hidden * h + c_mlp * inter)
    # Checkpointing keeps each layer's fp32 input and recomputes one layer at a time in backward.
    blocks = layers * tokens * h * 4 + layer if step.checkpointing else layers * layer
    # Logits in the compute dtype, their fp32 upcast and log-softmax kept for backward; in backward,
    # the logits' fp32 gradient (workspace).
    logits = tokens * vocab * (BYTES[step.precision] + 8)
    autocast_copies = trainable * 2 if half else 0  # autocast caches 16-bit copies of trainable weights
    forward = {"activations": blocks + logits + autocast_copies, "workspace": tokens * vocab * 4}
    gradients = trainable * 4
    # Gradients grow as backward frees activations: the peak is near one end or the other.
    at_peak = ({**forward, "gradients": 0} if sum(forward.values()) >= gradients
               else {"activations": 0, "workspace": 0, "gradients": gradients})
    breakdown = {
        "weights": frozen * BYTES[step.weights_dtype] + trainable * 4,
        "optimizer": trainable * 8,  # AdamW: exp_avg and exp_avg_sq in fp32
        **at_peak,
    }
    return {key: int(breakdown[key]) for key in BREAKDOWN_KEYS}
