"""Does the plan hold for GRPO? A GRPO step's predicted time (generation and training) and memory against a real run.

    .venv/bin/python bench/bench_grpo_plan.py ops [--model models/tiny-llama]
    .venv/bin/python bench/bench_grpo_plan.py run --config lora-kl0 [--model models/tiny-llama] [--steps 6] [--threads 1]
    .venv/bin/python bench/bench_grpo_plan.py decode --threads 1 [--model M] [--method full] [--rows 16] [--prompt 30]
    .venv/bin/python bench/bench_grpo_plan.py decode --threads 2 ...   (wall time: on a loaded machine, the neighbours')

On a loaded machine pass `--threads 1`: the probe and every time are then the process's CPU time (what a quiet core
spends; several threads' wall time under load measures OpenMP waiting on descheduled threads). `run` prints each part
of a step (generate, the no-grad scoring forwards, rewards, the training forward, optimizer, logging) beside the plan's.
`decode`: `generate` alone against `generation.generation_seconds`, the runs its no-grad op cost is fitted on, and
per new token (the difference of the last two token counts) beside the plan's terms: FLOPs at the probed matmul rate,
weights and KV cache at the probed memory rate, sampling, ops. On one thread the clock and the probe (matmul, op and
memory) are the process's CPU time; on more, wall time and the probe measured now, under the load of the moment.

`ops`: the aten ops transformers' `generate` dispatches per new token besides the model's forward (sampling, stopping
criteria, cache bookkeeping), counted on real tensors: (ops of generating N tokens - ops of generating 1) / (N - 1)
minus one decode forward's ops (as the plan traces it). The plan's `generation.GENERATE_LOOP_OPS` comes from here.

`run`: recipes/demo_grpo.yaml (data/demo/prompts.jsonl, its rewards) with each configuration's method (LoRA: r 16
on the seven linear layers), KL weight, completion length and batch, prepared and planned for this machine as the plan stage does (`make_plan`, the recorded
CPU probe), then trained by the real train stage (`run_training`, trl_cpu) in a fresh process under the train job's
allocator. Measured: the trainer's runtime per step (train_metrics.json `trainer_runtime_seconds`, every step's
generation, scoring and training), the time inside `generate` per step (a timer around GenerationMixin.generate),
and the train process's peak RSS (its own ru_maxrss, train_metrics.json); predicted: `time.seconds_per_step`,
`generation.seconds_per_step`, and the host memory the plan asks for before its 1.25 margin
(680 MiB + `memory.peak_bytes_per_device` × the allocator's retention).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
RECIPE = ROOT / "recipes/demo_grpo.yaml"
CONFIGS = {  # name: (method, kl_weight, max_completion_length, global batch (completions), generations)
    "lora-kl0": ("lora", 0.0, 8, 16, 4),
    "lora-kl0.05": ("lora", 0.05, 8, 16, 4),
    "lora-kl0-c32": ("lora", 0.0, 32, 16, 4),
    "full-kl0.05": ("full", 0.05, 8, 16, 4),
    # Not checked: the run GRPO_STEP_OPS (plan.generation) is fitted on.
    "fit-full-kl0-c16": ("full", 0.0, 16, 8, 2),
}
LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
TRAIN = """
import json, os, sys, time
from pathlib import Path
import torch
import transformers
import transformers.generation.utils as generation
import trl
from xtrain.recipe import Train, Hardware
from xtrain.train.run import run_training

# Seconds inside each part of a GRPO step, summed over the run, and each optimizer step's time (the first one pays
# one-off set-up that the later ones do not). On one thread the clock is the process's CPU time: what the step costs
# on a quiet core, whatever the neighbours' load (on several, CPU time would count OpenMP's spinning too).
threads = int(sys.argv[6])
torch.set_num_threads(threads)
clock = time.process_time if threads == 1 else time.perf_counter
parts = {}
def timed(owner, name, label=None):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        key = label(*args, **kwargs) if callable(label) else (label or name)
        started = clock()
        try:
            return original(*args, **kwargs)
        finally:
            parts.setdefault(key, []).append(clock() - started)
    setattr(owner, name, wrapper)
timed(generation.GenerationMixin, "generate")
timed(trl.GRPOTrainer, "_generate_and_score_completions", "generate_and_score")
timed(trl.GRPOTrainer, "_calculate_rewards", "rewards")
timed(trl.GRPOTrainer, "_get_per_token_logps_and_entropies",
      lambda *a, **k: "logps_train" if torch.is_grad_enabled() else "logps_scoring")
timed(transformers.Trainer, "training_step")
# Outside the micro-steps: the optimizer, the step's callbacks (xtrain's events among them) and the step's logging.
import accelerate.optimizer
timed(accelerate.optimizer.AcceleratedOptimizer, "step", "optimizer_step")
timed(transformers.trainer_callback.CallbackHandler, "on_step_end", "callbacks_step_end")
timed(transformers.Trainer, "_maybe_log_save_evaluate", "log_save_evaluate")
steps = []
class Steps(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        steps.append(clock())
    def on_train_end(self, args, state, control, **kwargs):
        steps.append(clock())
original_init = transformers.Trainer.__init__
def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    self.add_callback(Steps())
transformers.Trainer.__init__ = init
model, prepared, plan, train, out = sys.argv[1:6]
run_training(model_dir=Path(model), prepared_dir=Path(prepared), plan_path=Path(plan),
             train=Train.model_validate_json(train), hardware=Hardware(cpus=threads), out=Path(out) / "checkpoint",
             work_dir=Path(out) / "runs")
parts["step_walls"] = [round(b - a, 4) for a, b in zip(steps, steps[1:])]
Path(out, "parts.json").write_text(json.dumps(parts))
"""
MIB = 2**20
# generate's sampling as GRPOTrainer configures it (TRL 1.16's defaults: no top-k, top-p 1, no repetition penalty),
# not transformers' own default top-k of 50, which sorts the vocabulary at every new token.
SAMPLING = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0}


def count_loop_ops(model_dir: Path, tokens: int = 16, rows: int = 2) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from xtrain.plan.generation import forward_trace
    from xtrain.recipe import Train

    class Counter(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.randint(4, model.config.vocab_size, (rows, 12))

    def ops(new: int) -> int:
        counter = Counter()
        with counter, torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           pad_token_id=model.config.pad_token_id, **SAMPLING)
        return counter.ops

    per_token = (ops(tokens) - ops(1)) / (tokens - 1)
    forward = forward_trace(model_dir, Train(method="full"), "fp32", False).ops
    return {"ops_per_new_token": per_token, "forward_ops": forward, "loop_ops": per_token - forward}


def decode(model_dir: Path, method: str, rows: int, prompt: int, tokens: tuple[int, ...], repeats: int,
           threads: int) -> list[str]:
    """`generate`'s seconds on `rows` prompts of `prompt` tokens for each count of new tokens (best of `repeats`; one
    thread: CPU time, more: wall), beside what `generation.generation_seconds` predicts for the same batch, then the
    seconds per new token between the last two counts, measured and predicted, with the prediction's terms."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from xtrain.plan import generation
    from xtrain.plan.generation import Sampling, forward_trace, generation_seconds
    from xtrain.plan.model import count_parameters
    from xtrain.plan.probe import fixed_probe
    from xtrain.plan.speed import CPU_MATMUL_EFFICIENCY, CPU_OP_COST_FACTOR
    from xtrain.recipe import Train

    torch.set_num_threads(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    train = Train(method=method, lora=LORA if method == "lora" else None)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
                                                 target_modules=LORA["target_modules"]))
    model.eval()
    ids = torch.randint(4, model.config.vocab_size, (rows, prompt))
    probe = fixed_probe(os.environ["XTRAIN_CPU_PROBE"])
    rates = {"matmul_flops": probe["matmul_flops"] * CPU_MATMUL_EFFICIENCY["fp32"],
             "op_seconds": probe["op_seconds"] * CPU_OP_COST_FACTOR,
             "memory_bytes_per_second": probe["memory_bytes_per_second"], "accelerator": "cpu", "cpu_probe": probe}
    trace = forward_trace(model_dir, train, "fp32", False)
    params = count_parameters(model_dir, train, False)

    def measured(new: int) -> float:
        def once() -> float:
            started = clock()
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                               min_new_tokens=new, pad_token_id=model.config.pad_token_id or 0, **SAMPLING)
            return clock() - started
        once()
        return min(once() for _ in range(repeats))

    lines, runs = [], {}
    for new in tokens:
        predicted = generation_seconds(trace, params, Sampling(rows, prompt, new, 1.0, False), rates)
        runs[new] = (predicted, measured(new))
        lines.append(f"| {model_dir.name} {method} | {rows} x {prompt} | {new} | {predicted:.3f} | {runs[new][1]:.3f} | "
                     f"**{predicted / runs[new][1]:.2f}** |")
    if len(tokens) > 1:
        (a, (pa, ma)), (b, (pb, mb)) = sorted(runs.items())[-2:]
        predicted, seconds = (pb - pa) / (b - a), (mb - ma) / (b - a)
        context = prompt + (a + b) / 2
        flops = rows * (trace.flops_per_token + 4 * params["layers"] * params["hidden_size"] * context)
        memory = trace.weight_bytes + rows * context * trace.kv_bytes_per_token
        terms = {"FLOPs": flops / rates["matmul_flops"], "memory": memory / rates["memory_bytes_per_second"],
                 "sampling": rows * params["vocab_size"] * generation.CPU_SAMPLING_SECONDS_PER_LOGIT,
                 "ops": (trace.ops + generation.GENERATE_LOOP_OPS) * rates["op_seconds"] * generation.NO_GRAD_OP_SHARE}
        lines.append(f"\nper new token, tokens {a} to {b}: predicted {predicted * 1e3:.1f} ms ("
                     + ", ".join(f"{name} {value * 1e3:.1f}" for name, value in terms.items())
                     + f"; weights {trace.weight_bytes / 1e6:.0f} MB), measured {seconds * 1e3:.1f} ms: "
                     f"**{predicted / seconds:.2f}**")
    return lines


def recipe_for(name: str):
    from xtrain.recipe import Recipe

    method, kl, completion, batch, generations = CONFIGS[name]
    data = yaml.safe_load(RECIPE.read_text())
    data["train"] |= {"method": method, "global_batch_size": batch, "report_to": [],
                      "rl": {**data["train"]["rl"], "kl_weight": kl, "max_completion_length": completion,
                             "generations": generations}}
    data["train"].pop("lora", None)
    if method == "lora":  # as recipes/demo_grpo.yaml trained before it became a full fine-tune (26458ec)
        data["train"]["lora"] = LORA
    return Recipe.model_validate(data)


def run(name: str, model: Path, steps: int, work: Path, threads: int) -> str:
    from xtrain.artifacts import read_json
    from xtrain.data.pipeline import prepare
    from xtrain.plan import make_plan, write_plan
    from xtrain.plan.planner import HOST_REQUEST_MARGIN
    from xtrain.recipe import Hardware, stage_params
    from xtrain.train import allocator

    recipe = recipe_for(name)
    train = recipe.train.model_copy(update={"max_steps": steps})
    manifest = prepare([ROOT / source.path for source in recipe.data.sources], model, recipe.data, work / "prepared",
                       kind="prompts", prompt_settings=stage_params(recipe, "prepare")["prompts"])
    plan = make_plan(model, manifest, train, Hardware(cpus=threads))
    write_plan(work / "plan.json", plan)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env |= {variable: str(threads) for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")}
    env |= allocator.train_job_variables()
    trained = subprocess.run([sys.executable, "-c", TRAIN, str(model), str(work / "prepared"), str(work / "plan.json"),
                              train.model_dump_json(), str(work), str(threads)], cwd=ROOT, env=env, capture_output=True, text=True)
    if trained.returncode:
        raise SystemExit(f"the train stage failed:\n{trained.stderr[-3000:]}")
    metrics = read_json(work / "checkpoint/train_metrics.json")
    peak = metrics["peak_host_memory_bytes"]  # the train process's own ru_maxrss, not this process's other children
    parts = json.loads((work / "parts.json").read_text())
    walls = parts.pop("step_walls")
    # Each part's seconds per optimizer step after the first (which pays one-off set-up: measured apart).
    steady = {key: round(sum(calls[len(calls) // steps:]) / (steps - 1), 4) for key, calls in parts.items()}
    print(json.dumps({"parts_per_step_after_the_first": steady, "step_seconds": walls,
                      "predicted": predicted_parts(plan)}))
    phase = plan.generation
    # The peak RSS the plan predicts: its host-memory request without the request's margin (as bench_plan_real).
    predicted_host = plan.resources.mem_mb * MIB / HOST_REQUEST_MARGIN
    # The steps after the first, on the child's clock (one thread: CPU seconds); the first apart.
    step_seconds = sum(walls[1:]) / (steps - 1)
    lengths = [entry["completions/mean_length"] for entry in metrics["rl"]]
    return (f"| {name} | {plan.precision}, micro {plan.layout.micro_batch_size} x {plan.layout.gradient_accumulation_steps}"
            f" | {sum(lengths) / len(lengths):.1f} of {phase.completion_tokens} | {phase.seconds_per_step:.3f} | "
            f"{steady['generate']:.3f} | {plan.time.seconds_per_step:.3f} | {step_seconds:.3f} | {walls[0]:.2f} | "
            f"**{plan.time.seconds_per_step / step_seconds:.2f}** | {phase.peak_bytes_per_device / MIB:.1f} / "
            f"{phase.training_peak_bytes_per_device / MIB:.1f} | {predicted_host / MIB:.0f} | {peak / MIB:.0f} | "
            f"**{predicted_host / peak:.2f}** |")


def predicted_parts(plan) -> dict:
    """The plan's step split as the measured parts are: generation, and the rest (training micro-steps, scoring)."""
    generation = plan.generation.seconds_per_step
    return {"generate": generation, "training_and_scoring": round(plan.time.seconds_per_step - generation, 4)}


def probe_on_cpu_time(width: int) -> str:
    """The CPU probe of one thread, measured as `xtrain.plan.probe` measures it but on this process's CPU time: what
    a quiet core does, read through the neighbours' load (XTRAIN_CPU_PROBE's form)."""
    import time
    import types

    from xtrain.plan import probe

    probe.time = types.SimpleNamespace(perf_counter=time.process_time)
    try:
        figures = probe.measure("fp32", width, 1)
        memory = probe.measure_memory(width, 1)
    finally:
        probe.time = time
    return f"{figures['matmul_flops']},{figures['op_seconds']},{memory['memory_bytes_per_second']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("ops", "run", "decode"))
    parser.add_argument("--method", choices=("lora", "full"), default="full", help="decode: the model as trained")
    parser.add_argument("--rows", type=int, default=16, help="decode: sequences generated at once")
    parser.add_argument("--prompt", type=int, default=30, help="decode: prompt tokens")
    parser.add_argument("--tokens", default="1,8,32", help="decode: new-token counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="lora-kl0")
    parser.add_argument("--model", type=Path, default=ROOT / "models/tiny-llama")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--probe-now", action="store_true", help="plan with the CPU probe measured now, under the "
                        "machine's present load, rather than the recorded one (XTRAIN_CPU_PROBE)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of the train job, and "
                        "the plan's hardware.cpus; 1: every time (the probe's, the steps') is the process's CPU time")
    args = parser.parse_args()
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model there; build it with `snakemake models/tiny-llama` (or pass --model)")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.what == "ops":
        print(json.dumps(count_loop_ops(args.model)))
        return
    width = json.loads((args.model / "config.json").read_text())["hidden_size"]
    if args.threads == 1 and not os.environ.get("XTRAIN_CPU_PROBE"):
        os.environ["XTRAIN_CPU_PROBE"] = probe_on_cpu_time(width)
        print(f"probe on CPU time, one thread: {os.environ['XTRAIN_CPU_PROBE']}")
    elif (args.probe_now or args.what == "decode") and not os.environ.get("XTRAIN_CPU_PROBE"):  # the figures of this moment's load, for the plan and nothing else
        from xtrain.plan.probe import measure, measure_memory

        figures = measure("fp32", width, args.threads)
        memory = measure_memory(width, args.threads)
        os.environ["XTRAIN_CPU_PROBE"] = (f"{figures['matmul_flops']},{figures['op_seconds']},"
                                          f"{memory['memory_bytes_per_second']}")
        print(f"probe now: {os.environ['XTRAIN_CPU_PROBE']}")
    if args.what == "decode":
        clock = "CPU" if args.threads == 1 else "wall"
        print(f"| model | rows x prompt | new tokens | predicted s | measured {clock} s | ratio |\n"
              "| --- | --- | --- | --- | --- | --- |")
        print("\n".join(decode(args.model.resolve(), args.method, args.rows, args.prompt,
                               tuple(int(n) for n in args.tokens.split(",")), args.repeats, args.threads)))
        print(f"load average {os.getloadavg()[0]:.2f} after")
        return
    with tempfile.TemporaryDirectory() as work:
        print("| config | plan | completion tokens (mean of max) | generation s/step predicted | measured | "
              "step s predicted | measured (steps 2+) | first step | ratio | plan peak MiB (generation / training) | "
              "host MiB predicted | peak RSS MiB | ratio |")
        print(run(args.config, args.model.resolve(), args.steps, Path(work), args.threads))
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
