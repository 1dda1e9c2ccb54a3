"""The `xtrain` command: thin subcommands over Snakemake (the engine: staleness is its, never redone here) and the
library.

    xtrain new NAME --model PATH --data FILE [--data FILE ...] [--objective sft|dpo|orpo|kto]
    xtrain run [RECIPE ...] [--slurm] [--cores N] [--dry-run] [-- SNAKEMAKE ARGS]
    xtrain status [RECIPE ...]
    xtrain plan RECIPE
    xtrain compare

Run it in the project folder (where the Snakefile is). Exit status: Snakemake's for `run`, 1 with a message for a
bad recipe or a missing file, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from .errors import XtrainError

STAGES = ("prepare", "plan", "train", "evaluate", "report", "gate")
RECIPES = Path("recipes")


def snakemake_command() -> list[str]:
    """Snakemake of this interpreter's environment (the project's .venv), or the one on PATH."""
    beside = Path(sys.executable).with_name("snakemake")
    return [str(beside)] if beside.exists() else ["snakemake"]


def recipe_names(names: list[str]) -> list[str]:
    known = sorted(path.stem for path in RECIPES.glob("*.yaml"))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise XtrainError(f"no recipe {', '.join(unknown)} in {RECIPES}/; known recipes: {', '.join(known) or 'none'}")
    return names or known


def new(args: argparse.Namespace) -> int:
    """Write recipes/NAME.yaml: the model, the data with each source's format detected from its first rows, and
    every other section with its defaults shown; it must load as a recipe before it is written."""
    from pydantic import ValidationError

    from .data.pipeline import check_first_rows
    from .recipe import DATA_KINDS, DataSource, Recipe

    out = RECIPES / f"{args.name}.yaml"
    if out.exists():
        raise XtrainError(f"{out} exists; choose another name or edit it")
    sources = []
    for path in args.data:
        if not Path(path).exists():
            raise XtrainError(f"--data {path}: no such file")
        fmt = check_first_rows(DataSource(path=path), Path(path), DATA_KINDS[args.objective])
        sources.append({"path": path} | ({"format": fmt} if args.objective == "sft" else {}))
    try:
        recipe = Recipe.model_validate({"model": {"path": args.model}, "data": {"sources": sources},
                                        "train": {"objective": args.objective, "backend": args.backend}})
    except ValidationError as exc:
        raise XtrainError(f"these settings make no valid recipe: {exc}") from None
    text = (f"# Written by `xtrain new {args.name}`: every setting with its default; docs/recipe.md says what each "
            "does.\n" + yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True), sort_keys=False))
    RECIPES.mkdir(exist_ok=True)
    partial = out.with_suffix(".yaml.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(out)
    found = ", ".join(f"{source['path']}: {source.get('format', DATA_KINDS[args.objective])}" for source in sources)
    print(f"wrote {out} ({found})")
    return 0


def run(args: argparse.Namespace) -> int:
    """Snakemake on the recipes' gates (everything up to them), with the Slurm profile when asked."""
    targets = [f"reports/{name}/gate.json" for name in recipe_names(args.recipes)] if args.recipes else []
    command = [*snakemake_command(), "--cores", str(args.cores), *targets]
    if args.slurm:
        command += ["--profile", "profiles/slurm"]
    if args.dry_run:
        command.append("--dry-run")
    return subprocess.run([*command, *args.snakemake]).returncode


def smoke(args: argparse.Namespace) -> int:
    """Snakemake on smoke/<recipe> for each named recipe; prints each report.md."""
    names = recipe_names(args.recipes)
    code = subprocess.run([*snakemake_command(), "--cores", str(args.cores),
                           *(f"smoke/{name}" for name in names)]).returncode
    for name in names:
        report = Path("smoke") / name / "report.md"
        if report.is_file():
            print(report.read_text(encoding="utf-8"))
    return code


def stage_status(names: list[str]) -> dict[str, dict[str, str]]:
    """Each recipe's stages: `done`, `missing`, or `stale: why`, as Snakemake's detailed summary says."""
    targets = [f"reports/{name}/gate.json" for name in names]
    result = subprocess.run([*snakemake_command(), "--detailed-summary", *targets], capture_output=True, text=True)
    if result.returncode != 0:
        raise XtrainError(f"snakemake --detailed-summary failed:\n{result.stderr[-2000:]}")
    lines = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    header = lines[0]
    rows = [dict(zip(header, line)) for line in lines[1:]]
    status: dict[str, dict[str, str]] = {name: {} for name in names}
    for row in rows:
        name = next((n for n in names if f"/{n}/" in f"/{row['output_file']}" or row["output_file"].endswith(f"/{n}")),
                    None)
        if name is None or row["rule"] not in STAGES or row["rule"] in status[name]:
            continue
        if row["status"] == "missing":
            state = "missing"
        elif row["status"] != "ok":
            state = f"stale: {row['status']}"
        else:
            state = "done" if row["plan"] == "no update" else "stale: an input it reads will be rebuilt"
        status[name][row["rule"]] = state
    return status


def status(args: argparse.Namespace) -> int:
    names = recipe_names(args.recipes)
    locks = list(Path(".snakemake/locks").glob("*.lock"))
    if locks:
        print("a Snakemake run holds this folder's lock (running now, or killed: `snakemake --unlock` clears it)")
    table = stage_status(names)
    width = max(len("recipe"), *(len(name) for name in names))
    print(f"{'recipe':<{width}}  " + "  ".join(f"{stage:<9}" for stage in STAGES))
    for name in names:
        print(f"{name:<{width}}  " + "  ".join(f"{table[name].get(stage, '-').split(':')[0]:<9}" for stage in STAGES))
    for name in names:
        for stage in STAGES:
            if ":" in table[name].get(stage, ""):
                print(f"  {name} {stage}: {table[name][stage].split(': ', 1)[1]}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """The recipe's plan as a table (built first when it is missing or stale)."""
    from .plan import read_plan

    (name,) = recipe_names([args.recipe])
    path = Path(f"plans/{name}/plan.json")
    built = subprocess.run([*snakemake_command(), "--cores", "all", str(path)], capture_output=True, text=True)
    if built.returncode != 0:
        sys.stderr.write(built.stdout[-3000:] + built.stderr[-3000:])
        return built.returncode
    result = read_plan(path)
    memory, layout, time, resources = result.memory, result.layout, result.time, result.resources
    rows = [
        ("model", f"{result.model.total:,} parameters, {result.model.trainable:,} trained"),
        ("data", f"{result.data.train_rows:,} rows, {result.data.train_tokens:,} tokens, longest "
                 f"{result.data.longest_sequence_tokens} (seq_len {result.data.seq_len})"),
        ("layout", f"{layout.strategy} on {layout.devices} device(s) x {layout.nodes} node(s): micro-batch "
                   f"{layout.micro_batch_size} x accumulation {layout.gradient_accumulation_steps}"),
        ("precision", f"{result.precision} (weights {result.weights_dtype}), gradient checkpointing "
                      f"{'on' if result.gradient_checkpointing else 'off'}"),
        ("memory", f"{size(memory.peak_bytes_per_device)} peak per device of {size(memory.budget_bytes_per_device)} "
                   f"({memory.device}, {memory.estimator}): "
                   + ", ".join(f"{k} {size(v)}" for k, v in memory.breakdown_bytes.items())),
        ("time", f"{time.steps:,} steps x {time.seconds_per_step:.3g} s = {time.seconds / 60:.1f} min"),
        ("asks for", f"{resources.gpus} GPU(s), {resources.cpus} CPU(s), {resources.mem_mb:,} MB, {resources.runtime} min, "
                     f"{resources.nodes} node(s)"),
    ]
    width = max(len(key) for key, _ in rows)
    print(f"plan of {name} ({path})")
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
    return 0


def size(count: int) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def compare(args: argparse.Namespace) -> int:
    code = subprocess.run([*snakemake_command(), "--cores", "all", "compare"]).returncode
    if code == 0:
        print("reports/compare.html")
    return code


def parser() -> argparse.ArgumentParser:
    from .recipe import BACKENDS, OBJECTIVES

    top = argparse.ArgumentParser(prog="xtrain", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    p = commands.add_parser("new", help="write a recipe with the defaults shown and the data format detected")
    p.add_argument("name")
    p.add_argument("--model", required=True, help="a model folder, or a hub id in the local cache")
    p.add_argument("--data", required=True, action="append", help="a data file (repeat for several sources)")
    p.add_argument("--objective", choices=OBJECTIVES, default="sft")
    p.add_argument("--backend", choices=BACKENDS, default="trl_cpu")
    p.set_defaults(action=new)
    p = commands.add_parser("run", help="build recipes up to their gate (all recipes when none is named)")
    p.add_argument("recipes", nargs="*")
    p.add_argument("--slurm", action="store_true", help="submit jobs with the Slurm profile (profiles/slurm)")
    p.add_argument("--cores", default="all")
    p.add_argument("--dry-run", "-n", action="store_true", help="say what would run, and why")
    p.add_argument("snakemake", nargs=argparse.REMAINDER, help="after --: passed to snakemake as they are")
    p.set_defaults(action=run)
    p = commands.add_parser("smoke", help="rehearse recipes on the CPU in minutes (smoke/<recipe>/report.md)")
    p.add_argument("recipes", nargs="*")
    p.add_argument("--cores", default="all")
    p.set_defaults(action=smoke)
    p = commands.add_parser("status", help="each recipe's stages: done, missing, or stale and why")
    p.add_argument("recipes", nargs="*")
    p.set_defaults(action=status)
    p = commands.add_parser("plan", help="a recipe's plan (memory, layout, time, resources) as a table")
    p.add_argument("recipe")
    p.set_defaults(action=plan)
    p = commands.add_parser("compare", help="reports/compare.html: every recipe's metrics side by side")
    p.set_defaults(action=compare)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "snakemake", None) and args.snakemake[0] == "--":
        args.snakemake = args.snakemake[1:]
    if not Path("Snakefile").exists():
        print(f"xtrain: no Snakefile in {os.getcwd()}; run xtrain in the project folder", file=sys.stderr)
        return 1
    try:
        return args.action(args)
    except XtrainError as exc:
        print(f"xtrain {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
