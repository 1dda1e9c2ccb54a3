"""How right is the plan? Predicted vs measured peak memory and step time on this CPU, and plan vs TRL defaults.

    .venv/bin/python bench/bench_plan.py          # ~15 min on 2 cores; prints the tables for BENCHMARKS.md
    .venv/bin/python bench/bench_plan.py --dpo    # only the DPO rows and DPO's speed against TRL's defaults

Two models built offline with random weights: the demo's tiny Llama (0.37M parameters) and a 27M Llama
(hidden 512, 6 layers, vocab 16384). Each configuration runs in its own process so that memory is
measured from a clean baseline, the way FIELD-NOTES says it must be: glibc told to return freed memory
(MALLOC_MMAP_THRESHOLD_), weights materialised before the baseline, VmHWM reset through
/proc/self/clear_refs. Measured: peak RSS growth over four training steps (weights, gradients, optimizer
states, activations: what the plan calls peak memory), MemTracker's tracked tensor peak on two more real
steps, and the median step time. Predicted: the plan's traced and analytical estimators and its step time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
MIB = 2**20
BATCH = 4
GRID = [  # (model, objective, method, checkpointing, seq_len, precision): both methods, both ways, both lengths
    ("tiny", "sft", "full", False, 256, "fp32"), ("tiny", "sft", "full", True, 512, "fp32"),
    ("tiny", "sft", "lora", False, 512, "fp32"), ("tiny", "sft", "lora", True, 256, "fp32"),
    ("27m", "sft", "full", False, 256, "fp32"), ("27m", "sft", "full", True, 512, "fp32"),
    ("27m", "sft", "lora", False, 512, "fp32"), ("27m", "sft", "lora", True, 256, "fp32"),
    ("27m", "sft", "full", False, 512, "bf16"), ("27m", "sft", "lora", False, 512, "bf16"),
]
# DPO: BATCH pairs a step (2 x BATCH sequences), the reference forward first; LoRA's reference is the base with the
# adapter disabled, full fine-tuning's a frozen copy.
DPO_GRID = [("27m", "dpo", "lora", False, 256, "fp32"), ("27m", "dpo", "lora", True, 512, "fp32"),
            ("27m", "dpo", "full", False, 256, "fp32"), ("27m", "dpo", "full", True, 512, "fp32")]


def build_models(folder: Path) -> dict[str, Path]:
    from xtrain.models.tiny import build_tiny_model

    tiny = folder / "tiny"
    tiny.mkdir()
    build_tiny_model(ROOT / "data/tiny-llama/corpus.txt", tiny)
    return {"tiny": tiny, "27m": build_27m(folder / "27m")}


def under_train_job_allocator(script: str, *arguments: str) -> str:
    """The last line `script` prints, run with `arguments` in a fresh process under the allocator a train job gets."""
    from xtrain.train import allocator

    env = {**os.environ, **allocator.train_job_variables()}
    result = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True, check=True, env=env)
    return result.stdout.strip().splitlines()[-1]


def build_27m(folder: Path) -> Path:
    """The 27.4M-parameter Llama of FIELD-NOTES' CPU throughput reference, random-init (weights only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16384, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def training_step(model, optimizer, ids, precision, objective="sft", reference=None):
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        if objective == "dpo":
            loss = dpo_loss(model, ids, reference)
        else:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def dpo_loss(model, ids, reference, beta=0.1):
    """DPO's sigmoid loss as TRL 1.16 computes it: each sequence's log-prob under the reference without gradients
    (first), then under the policy, over the chosen (first half of `ids`) and rejected (second half) rows."""
    from contextlib import nullcontext

    import torch
    import torch.nn.functional as F
    from trl.trainer.utils import selective_log_softmax

    def logps(net):
        return selective_log_softmax(net(input_ids=ids, use_cache=False).logits[:, :-1], ids[:, 1:]).sum(-1)

    with torch.no_grad(), model.disable_adapter() if reference is None else nullcontext():
        reference_logps = logps(reference or model)
    policy = logps(model)
    half = ids.shape[0] // 2
    margin = (policy[:half] - reference_logps[:half]) - (policy[half:] - reference_logps[half:])
    return -F.logsigmoid(beta * margin).mean()


def load(model_dir: Path, method: str, checkpointing: bool):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from xtrain.recipe import Train

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for param in model.parameters():  # transformers maps safetensors lazily: make the weights resident
        param.data = param.data.clone()
    if method == "lora":
        model = get_peft_model(model, LoraConfig(**Train(method="lora").lora.peft_kwargs()))
    if checkpointing:
        model.activation_checkpointing_enable()
        if method == "lora":
            model.enable_input_require_grads()
    return model.train()


def reference_copy(model_dir: Path, objective: str, method: str):
    """Full fine-tuning DPO's frozen reference model (LoRA's is the policy with its adapter disabled)."""
    if objective != "dpo" or method != "full":
        return None
    model = load(model_dir, "full", False).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def measure_memory(model_dir: Path, objective: str, method: str, checkpointing: bool, seq_len: int,
                   precision: str) -> dict:
    """Peak RSS growth over four steps and MemTracker's tracked tensor peak over two more, in a fresh process."""
    import gc

    import torch

    from xtrain.plan.memory import TrainableMemTracker

    torch.manual_seed(0)
    run_steps(model_dir, objective, method, checkpointing, seq_len, precision, 2)  # code, kernels, pools in first
    gc.collect()
    baseline = rss_kib("VmRSS")
    model, reference = load(model_dir, method, checkpointing), reference_copy(model_dir, objective, method)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS; loading's transients do not count
    model, optimizer, ids = run_steps(model_dir, objective, method, checkpointing, seq_len, precision, 4, model,
                                      reference=reference)
    rss_peak = (rss_kib("VmHWM") - baseline) * 1024
    if objective == "dpo":  # MemTracker refuses a second forward through the same modules in one step
        return {"rss_growth": rss_peak, "tracked": None}
    tracker = TrainableMemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        for _ in range(2):
            training_step(model, optimizer, ids, precision, objective, reference)
            tracker.reset_mod_stats()
    tracked = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    return {"rss_growth": rss_peak, "tracked": tracked}


def measure_seconds(model_dir: Path, objective: str, method: str, checkpointing: bool, seq_len: int,
                    precision: str) -> dict:
    """Median seconds of steps 2-5 (glibc's default allocator: the memory run's settings slow every step)."""
    import torch

    torch.manual_seed(0)
    seconds = []
    run_steps(model_dir, objective, method, checkpointing, seq_len, precision, 5, on_step=seconds.append)
    return {"step_seconds": statistics.median(seconds[1:])}


def run_steps(model_dir, objective, method, checkpointing, seq_len, precision, steps, model=None,
              on_step=lambda s: None, reference=None):
    import torch

    model = model or load(model_dir, method, checkpointing)
    reference = reference or reference_copy(model_dir, objective, method)
    rows = BATCH * (2 if objective == "dpo" else 1)  # a DPO pair is two sequences
    ids = torch.randint(0, model.config.vocab_size, (rows, seq_len))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], fused=True)
    for _ in range(steps):
        started = time.perf_counter()
        training_step(model, optimizer, ids, precision, objective, reference)
        on_step(time.perf_counter() - started)
    return model, optimizer, ids


def predict(model_dir: Path, objective: str, method: str, checkpointing: bool, seq_len: int, precision: str) -> dict:
    from xtrain.plan.memory import Step
    from xtrain.plan.model import count_parameters
    from xtrain.plan.planner import Planner
    from xtrain.recipe import Hardware, Train

    train = Train(method=method, objective=objective)
    params = count_parameters(model_dir, train)
    sequences = 2 if objective == "dpo" else 1
    step = Step(BATCH, seq_len, precision, "fp32", checkpointing, sequences=sequences)
    planner = Planner(model_dir, train, Hardware(), params, sequences=sequences)
    seconds, _ = planner.seconds_per_micro_step(step, BATCH * sequences * seq_len)
    estimates = {}
    for estimator in ("traced", "analytical"):  # each with the plan's own additions (a DPO reference copy)
        estimates[estimator] = sum(Planner(model_dir, train, Hardware(), params, estimator=estimator,
                                           sequences=sequences).training_breakdown(step, "single").values())
    return {**estimates, "step_seconds": seconds}


def in_fresh_process(function: str, *args, malloc_returns_memory: bool = False) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if malloc_returns_memory:  # without it glibc keeps freed memory and RSS reads 30-84% high
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    code = f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import bench_plan as b; " \
           f"from pathlib import Path; print(json.dumps(b.{function}(Path({str(args[0])!r}), *{args[1:]!r})))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def tracked(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}"


def error(predicted: float, measured: float) -> str:
    return f"{100 * (predicted / measured - 1):+.1f}%"


def plan_vs_trl_defaults(model_dir: Path, objective: str = "sft", methods=("lora", "full")) -> list[str]:
    """Tokens/s of the plan's settings against TRL's defaults (bf16 autocast + checkpointing), same harness; for DPO,
    BATCH pairs a step (the reference forward included)."""
    import torch

    from xtrain.plan import make_plan
    from xtrain.recipe import DATA_KINDS, Hardware, Train

    seq_len, sequences = 512, 2 if objective == "dpo" else 1
    split = {"rows": 64, "tokens": 64 * sequences * seq_len, "supervised_tokens": 64 * seq_len // 3, "max_len": seq_len,
             "sequences_per_row": sequences}
    manifest = {"seq_len": seq_len, "splits": {"train": split, "eval": split}, "fingerprint": "bench",
                **({"data_kind": DATA_KINDS[objective]} if objective != "sft" else {})}
    rows = []
    for method in methods:
        plan = make_plan(model_dir, manifest, Train(method=method, objective=objective, global_batch_size=BATCH),
                         Hardware())
        chosen = (plan.precision, plan.gradient_checkpointing, plan.layout.micro_batch_size)
        settings = {"plan": chosen, "TRL defaults": ("bf16", True, BATCH)}
        runs = {name: [] for name in settings}
        models = {name: load(model_dir, method, ckpt) for name, (_, ckpt, _) in settings.items()}
        references = {name: reference_copy(model_dir, objective, method) for name in settings}
        optimizers = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad])
                      for name, m in models.items()}
        for round_ in range(4):  # alternate, so both see the same machine load
            for name, (precision, _, micro) in settings.items():
                ids = torch.randint(0, models[name].config.vocab_size, (micro * sequences, seq_len))
                started = time.perf_counter()
                for _ in range(BATCH // micro):
                    training_step(models[name], optimizers[name], ids, precision, objective, references[name])
                if round_:
                    runs[name].append(BATCH * sequences * seq_len / (time.perf_counter() - started))
        speed = {name: statistics.median(values) for name, values in runs.items()}
        rows.append(f"| 27M {objective} {method}, seq {seq_len}, batch {BATCH} | {chosen[0]}, checkpointing "
                    f"{chosen[1]}, micro {chosen[2]} | {speed['plan']:.0f} | {speed['TRL defaults']:.0f} | "
                    f"**{speed['plan'] / speed['TRL defaults']:.2f}×** |")
    return rows


def main() -> None:
    grid = DPO_GRID if "--dpo" in sys.argv[1:] else GRID + DPO_GRID
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # probe this machine now, under today's load
        models = build_models(Path(tmp))
        print("| model | objective | method | checkpointing | seq | precision | measured RSS growth MiB | tracked MiB | "
              "traced MiB (err vs RSS) | analytical MiB (err vs RSS) | measured step s | predicted step s (err) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for model, objective, method, checkpointing, seq_len, precision in grid:
            args = (models[model], objective, method, checkpointing, seq_len, precision)
            real = {**in_fresh_process("measure_memory", *args, malloc_returns_memory=True),
                    **in_fresh_process("measure_seconds", *args)}
            guess = predict(*args)
            print(f"| {model} | {objective} | {method} | {checkpointing} | {seq_len} | {precision} | "
                  f"{real['rss_growth'] / MIB:.1f} | {tracked(real['tracked'])} | "
                  f"{guess['traced'] / MIB:.1f} ({error(guess['traced'], real['rss_growth'])}) | "
                  f"{guess['analytical'] / MIB:.1f} ({error(guess['analytical'], real['rss_growth'])}) | "
                  f"{real['step_seconds']:.3f} | {guess['step_seconds']:.3f} "
                  f"({error(guess['step_seconds'], real['step_seconds'])}) |", flush=True)
        print("\n| run | plan's settings | plan tokens/s | TRL defaults tokens/s | speed-up |")
        print("| --- | --- | --- | --- | --- |")
        if grid is not DPO_GRID:
            print("\n".join(plan_vs_trl_defaults(models["27m"])))
        print("\n".join(plan_vs_trl_defaults(models["27m"], "dpo", methods=("lora",))))
    print(f"\n(bench took {time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
