"""What each training backend can run, declared as data: one table that preflight, the plan and the docs read.

`refusal` checks a recipe against a backend's `Capabilities` before any job runs (preflight and the train stage);
the plan reads which precisions a backend trains in and whether it compiles; docs/backends.md's capability table is
generated from the same table (`capability_rows`). Each lane (`CAPABILITIES[name]` in its class) says nothing else
about what it can run. This module imports only the recipe schema, so that the plan can read it without loading
any lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

from ...recipe import TRACKERS, Hardware, Train

Status = Literal["trains", "translate-only"]
# train.lora settings beyond plain LoRA (each off by default); a backend maps them or refuses them.
LORA_OPTIONS = ("use_dora", "use_rslora", "modules_to_save")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data. Each field is documented in docs/backends.md's capability table."""

    status: Status  # trains, or only writes its native config and launch (not yet run end to end)
    accelerators: tuple[str, ...]  # hardware.accelerator values
    max_gpus_per_node: int | None  # hardware.gpus (0: the CPU only; None: any count)
    max_nodes: int | None  # hardware.nodes (None: any count, through Slurm)
    max_processes: int | None  # hardware.processes: CPU data-parallel processes per node (None: any)
    methods: tuple[str, ...]  # train.method values
    objectives: tuple[str, ...]  # training objectives (supervised fine-tuning: sft)
    precisions: tuple[str, ...]  # autocast dtypes the plan may choose for it
    packing: bool  # trains on packed rows (data.packing: true)
    resume: bool  # continues an interrupted run from its last trainer checkpoint
    adapter_continue: bool = False  # trains an upstream recipe's LoRA adapter further (model.adapter: continue)
    compiles: bool = False  # trains under torch.compile (and buckets batch lengths) when the plan decides it pays
    groups_by_length: bool = False  # sends SFT's unpacked rows in transformers' length-grouped order (plan.row_order)
    chooses_attention: bool = False  # loads the model with the plan's attention (plan.attention: eager on a CPU)
    trackers: tuple[str, ...] = TRACKERS  # train.report_to values it writes to
    lora_options: tuple[str, ...] = LORA_OPTIONS  # train.lora settings beyond plain LoRA that it maps
    neftune: bool = True  # adds NEFTune noise to the input embeddings (train.neftune_noise_alpha)
    quant_types: tuple[str, ...] = ("nf4", "fp4")  # train.quantization.quant_type values (method qlora)
    single_quant: bool = True  # trains a 4-bit base without double quantization (train.quantization.double_quant: false)


CAPABILITIES: dict[str, Capabilities] = {
    "trl_cpu": Capabilities(
        status="trains", accelerators=("cpu",), max_gpus_per_node=0, max_nodes=1, max_processes=1,
        methods=("lora", "qlora", "full"), objectives=("sft", "dpo", "kto", "orpo", "grpo"),
        precisions=("fp32", "bf16"), packing=True, resume=True, compiles=True, adapter_continue=True,
        groups_by_length=True, chooses_attention=True,
    ),
    "trl_local": Capabilities(
        status="trains", accelerators=("cpu", "cuda", "rocm"), max_gpus_per_node=None, max_nodes=None,
        max_processes=None, methods=("lora", "qlora", "full"), objectives=("sft", "dpo", "kto", "orpo", "grpo"),
        precisions=("fp32", "bf16", "fp16"), packing=True, resume=True, compiles=True, adapter_continue=True,
        groups_by_length=True, chooses_attention=True,
    ),
    # One CPU process: under torchrun on the CPU, Axolotl 0.19's normalize_config sets device_map {"": LOCAL_RANK},
    # and loading the model then fails ("RuntimeError: Cannot access accelerator device when none is available").
    # Packed rows: Axolotl's own packing cannot keep packed sequences apart on the CPU. ORPO: Axolotl trains it with
    # TRL 1.9's ORPOTrainer, which tokenizes text with BOS/EOS rules of its own, not the prepared tokens.
    "axolotl": Capabilities(
        status="trains", accelerators=("cpu", "cuda", "rocm"), max_gpus_per_node=None, max_nodes=None, max_processes=1,
        methods=("lora", "qlora", "full"), objectives=("sft", "dpo", "kto", "grpo"),
        precisions=("fp32", "bf16", "fp16"),
        packing=False, resume=True, groups_by_length=True,
    ),
    # One process on the CPU or on one CUDA GPU: Unsloth's open-source release trains on a single GPU. On the CPU
    # Unsloth leaves TRL's preference trainers as they are (its own patches are for GPUs). Its 4-bit loader builds
    # the quantization itself (nf4, double-quantized); its get_peft_model has no DoRA.
    "unsloth": Capabilities(
        status="trains", accelerators=("cpu", "cuda"), max_gpus_per_node=1, max_nodes=1, max_processes=1,
        methods=("lora", "qlora", "full"), objectives=("sft", "dpo", "kto", "orpo", "grpo"),
        precisions=("fp32", "bf16", "fp16"),
        packing=True, resume=True, lora_options=("use_rslora", "modules_to_save"), quant_types=("nf4",),
        single_quant=False, groups_by_length=True,
    ),
    # Any GPU count and node count through its distributed recipes; ROCm through torch's cuda device and
    # nccl (RCCL) API, which is all torchtune calls. One CPU process: its distributed recipes fail on the CPU.
    # QLoRA: its LoRA builders' quantize_base (torchao's NF4, whose block scales are themselves quantized); DoRA:
    # their use_dora. Its LoRA builders have no rsLoRA scaling, no fully trained modules and no NEFTune.
    "torchtune": Capabilities(
        status="trains", accelerators=("cpu", "cuda", "rocm"), max_gpus_per_node=None, max_nodes=None, max_processes=1,
        methods=("lora", "qlora", "full"), objectives=("sft", "dpo"), precisions=("fp32", "bf16"), packing=True,
        resume=False, lora_options=("use_dora",), neftune=False, quant_types=("nf4",), single_quant=False,
    ),
    # Reading Megatron Bridge's output back into the checkpoint contract needs a ROCm machine to check against:
    # until then the backend writes its experiment and launch (`write_config`, `launch_command`) but does not train.
    # It maps Megatron Bridge's plain LoRA only: no 4-bit base, no LoRA variants, no NEFTune.
    "primus": Capabilities(
        status="translate-only", accelerators=("rocm",), max_gpus_per_node=None, max_nodes=None, max_processes=1,
        methods=("lora", "full"), objectives=("sft",), precisions=("bf16", "fp16", "fp32"), packing=True, resume=False,
        trackers=("tensorboard", "wandb"), lora_options=(), neftune=False,
    ),
}


def refusal(name: str, can: Capabilities, train: Train, hardware: Hardware, packed: bool) -> str | None:
    """Why backend `name` cannot run these settings, naming the field and the fix; None when it can."""
    others = "or choose another train.backend (docs/backends.md lists what each one runs)"
    if hardware.accelerator not in can.accelerators:
        return (f"train.backend {name} runs on hardware.accelerator {' or '.join(can.accelerators)}, not "
                f"{hardware.accelerator!r}: set hardware.accelerator: {can.accelerators[0]}"
                + (" and hardware.gpus: 0" if can.accelerators[0] == "cpu" else "") + f", {others}")
    if not at_most(hardware.gpus, can.max_gpus_per_node):
        return (f"train.backend {name} runs on at most {can.max_gpus_per_node} GPU(s) per node, not hardware.gpus "
                f"{hardware.gpus}: set hardware.gpus: {can.max_gpus_per_node}, {others}")
    if not at_most(hardware.nodes, can.max_nodes):
        return (f"train.backend {name} runs on {can.max_nodes} node(s) at most, not hardware.nodes {hardware.nodes}: "
                f"set hardware.nodes: {can.max_nodes}, {others}")
    if not at_most(hardware.processes, can.max_processes):
        return (f"train.backend {name} runs {can.max_processes} CPU process(es) per node at most, not "
                f"hardware.processes {hardware.processes}: set hardware.processes: {can.max_processes}, {others}")
    if train.method not in can.methods:
        return f"train.backend {name} does not train method {train.method!r}: set train.method: {can.methods[0]}, {others}"
    if train.adapters and (unmapped := [o for o in LORA_OPTIONS if getattr(train.lora, o) and o not in can.lora_options]):
        return (f"train.backend {name} does not train {', '.join(f'train.lora.{o}' for o in unmapped)}: remove it "
                f"(it maps {', '.join(can.lora_options) or 'none of ' + ', '.join(LORA_OPTIONS)}), {others}")
    if train.neftune_noise_alpha is not None and not can.neftune:
        return (f"train.backend {name} does not add NEFTune noise (train.neftune_noise_alpha): remove it, {others}")
    if train.method == "qlora" and train.quantization.quant_type not in can.quant_types:
        return (f"train.backend {name} quantizes the base to {' or '.join(can.quant_types)} only, not "
                f"{train.quantization.quant_type} (train.quantization.quant_type): set train.quantization.quant_type: "
                f"{can.quant_types[0]}, {others}")
    if train.method == "qlora" and not train.quantization.double_quant and not can.single_quant:
        return (f"train.backend {name} always double-quantizes a 4-bit base (train.quantization.double_quant): set "
                f"train.quantization.double_quant: true, {others}")
    if train.objective not in can.objectives:
        return (f"train.backend {name} does not train objective {train.objective!r} (train.objective): set "
                f"train.objective: {' or '.join(can.objectives)}, {others}")
    if unsupported := [tracker for tracker in train.report_to if tracker not in can.trackers]:
        return (f"train.backend {name} cannot report to {', '.join(unsupported)} (train.report_to): it writes to "
                f"{', '.join(can.trackers)}; remove {', '.join(unsupported)} from train.report_to, {others}")
    if packed and not can.packing:
        return f"train.backend {name} cannot train on packed rows: set data.packing: false, {others}"
    if can.status != "trains":
        return (f"train.backend {name} is {can.status} in this version: it writes its native config and launch "
                f"command, but has not trained end to end; {others.removeprefix('or ')}")
    return None


def at_most(value: int, limit: int | None) -> bool:
    return limit is None or value <= limit


def capability_rows(table: Mapping[str, Capabilities]) -> list[str]:
    """docs/backends.md's capability table (markdown lines), one column per backend."""
    names = list(table)
    rows = ["| capability | " + " | ".join(f"`{name}`" for name in names) + " |",
            "| --- |" + " --- |" * len(names)]
    for field in fields(Capabilities):
        values = [getattr(table[name], field.name) for name in names]
        cells = [", ".join(map(str, value)) if isinstance(value, tuple) else "any" if value is None else
                 ("yes" if value else "no") if isinstance(value, bool) else str(value) for value in values]
        rows.append(f"| {field.name} | " + " | ".join(cells) + " |")
    return rows
