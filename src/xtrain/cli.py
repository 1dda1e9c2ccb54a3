"""The `xtrain` command: thin subcommands over Snakemake, the engine that decides what is stale (never redone here),
and over the library; run it anywhere inside a project folder.

    xtrain new NAME --model ORG/NAME|FOLDER --data FILE [--data FILE ...] [--format F] [--columns A=B,...]
               [--objective sft|dpo|orpo|kto|...]
    xtrain run [RECIPE ...] [--slurm] [--cores N] [--dry-run] [-- SNAKEMAKE ARGS]   (also: xtrain train)
    xtrain eval RECIPE ... | xtrain export RECIPE ... | xtrain chat RECIPE|FOLDER
    xtrain smoke [RECIPE ...] | xtrain status [RECIPE ...] | xtrain plan RECIPE | xtrain compare

A RECIPE is a name in recipes/ or the path of a .yaml file, in recipes/ or anywhere else (see `xtrain run --help`).
xtrain works in the nearest folder at or above the current one that holds the Snakefile. Exit status: Snakemake's
for the commands that run it, 1 with a message for a bad recipe or a missing file, 0 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

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


class Selection(NamedTuple):
    """Recipes named on the command line, and the folder Snakemake reads them from."""

    names: list[str]
    folder: Path  # relative to the project when inside it

    def config(self) -> list[str]:
        """Snakemake's arguments for a recipe folder other than recipes/ (`--config recipes=<folder>`)."""
        return [] if self.folder == RECIPES else ["--config", f"recipes={self.folder}"]

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.yaml"


def inside(path: Path) -> Path:
    """`path` relative to the project (the working folder) when it lies inside it, else absolute."""
    path = path.resolve()
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def selected(items: list[str], cwd: Path) -> Selection:
    """The recipes `items` name: bare names in recipes/, or .yaml paths relative to `cwd` (where xtrain started).
    Snakemake reads one recipes folder a run, so every path must lie in one folder; a recipe outside recipes/ is read
    where it lies, and must not share a name (and with it every output folder) with one in recipes/."""
    from .recipe import recipe_name

    entries = []
    for item in items:
        if not item.endswith((".yaml", ".yml")) and "/" not in item:
            entries.append((RECIPES, item))
            continue
        path = cwd / item
        if path.suffix != ".yaml":
            raise XtrainError(f"{item}: the workflow reads recipes from .yaml files: rename it to {path.stem}.yaml")
        if not path.is_file():
            raise XtrainError(f"{item}: no such recipe file (paths are taken from {cwd})")
        entries.append((inside(path.parent), recipe_name(path)))
    folders = sorted({str(folder) for folder, _ in entries})
    if len(folders) > 1:
        raise XtrainError(f"these recipes lie in {len(folders)} folders ({', '.join(folders)}); Snakemake reads one "
                          "recipes folder a run: run each folder's recipes on their own")
    folder = entries[0][0] if entries else RECIPES
    names = [name for _, name in entries]
    if folder == RECIPES:
        return Selection(recipe_names(names), RECIPES)
    if clash := [name for name in names if (RECIPES / f"{name}.yaml").exists()]:
        raise XtrainError(f"{folder / clash[0]}.yaml and {RECIPES / clash[0]}.yaml share the name {clash[0]}, and with "
                          f"it every output (checkpoints/{clash[0]}, reports/{clash[0]}): rename one of them")
    return Selection(names, folder)


def has_export(selection: Selection, name: str) -> bool:
    from .recipe import load_recipe

    return load_recipe(selection.path(name)).export is not None


def build(args: argparse.Namespace, selection: Selection, targets: list[str]) -> int:
    """Snakemake on `targets` (none: rule all) of the selection's folder, with the Slurm profile when asked."""
    # `--config` takes every word up to the next option, so the targets go before it.
    command = [*snakemake_command(), *targets, *selection.config(), "--cores", str(args.cores)]
    if getattr(args, "slurm", False):
        command += ["--profile", "profiles/slurm"]
    if getattr(args, "dry_run", False):
        command.append("--dry-run")
    return subprocess.run([*command, *args.snakemake]).returncode


def model_setting(text: str, cwd: Path) -> dict[str, str]:
    """`--model`: a folder (there, or one a rule builds) is `model.path`; `org/name` is a hub id, `model.hub`."""
    from .recipe import HUB_ID

    folder = cwd / text
    built = yaml.safe_load(Path("config/config.yaml").read_text(encoding="utf-8"))
    built_by_rules = {built["tiny_model"]["path"], built["gguf_model"]["path"]}
    if folder.is_dir() or str(inside(folder)) in built_by_rules:
        return {"path": str(inside(folder))}
    if HUB_ID.match(text) and not text.startswith("."):
        return {"hub": text}
    raise XtrainError(f"--model {text}: neither a model folder (none at {folder}) nor a hub id like "
                      "HuggingFaceTB/SmolLM2-135M-Instruct")


def per_source(values: list[str] | None, count: int, flag: str) -> list[str | None]:
    """A `--format`/`--columns` value for each `--data` source: one for all, or one per source in their order."""
    if not values:
        return [None] * count
    if len(values) not in (1, count):
        raise XtrainError(f"{flag} is given {len(values)} times for {count} --data sources: give it once for all, "
                          "or once per source in the same order")
    return values * count if len(values) == 1 else values


def column_map(text: str) -> dict[str, str]:
    """`--columns prompt=question,completion=answer` -> {prompt: question, completion: answer}."""
    pairs = [item.split("=") for item in text.split(",") if item.strip()]
    if not pairs or any(len(pair) != 2 or not all(part.strip() for part in pair) for pair in pairs):
        raise XtrainError(f"--columns {text}: give OURS=THEIRS pairs separated by commas, e.g. "
                          "prompt=question,completion=answer")
    return {ours.strip(): theirs.strip() for ours, theirs in pairs}


def format_reading(columns: dict[str, str]) -> str:
    """The one row format that reads every column `--columns` renames (for `--columns` without `--format`)."""
    from .recipe import SOURCE_COLUMNS

    fits = [fmt for fmt, read in SOURCE_COLUMNS.items() if set(columns) <= set(read)]
    if len(fits) != 1:
        formats = "; ".join(f"{fmt}: {', '.join(read)}" for fmt, read in SOURCE_COLUMNS.items())
        raise XtrainError(f"--columns {','.join(columns)}: {'no' if not fits else 'more than one'} row format reads "
                          f"these names; give --format, or rename the columns one of them reads ({formats})")
    return fits[0]


def new(args: argparse.Namespace) -> int:
    """Write recipes/NAME.yaml: the model, the data with each source's format detected from its first rows, and
    every other section with its defaults shown; it must load as a recipe before it is written."""
    from pydantic import ValidationError

    from .data.pipeline import check_first_rows
    from .recipe import DATA_KINDS, DataSource, Recipe, recipe_name

    recipe_name(Path(f"{args.name}.yaml"))
    out = RECIPES / f"{args.name}.yaml"
    if out.exists():
        raise XtrainError(f"{out} exists; choose another name or edit it")
    formats = per_source(args.format, len(args.data), "--format")
    columns = [column_map(text) if text else {} for text in per_source(args.columns, len(args.data), "--columns")]
    sources = []
    for data, fmt, renamed in zip(args.data, formats, columns):
        path = args.cwd / data
        if not path.exists():
            raise XtrainError(f"--data {data}: no such file")
        asked = {"path": str(inside(path))} | ({"format": fmt or format_reading(renamed)} if fmt or renamed else {}) | (
            {"columns": renamed} if renamed else {})
        try:
            source = DataSource.model_validate(asked)
        except ValidationError as exc:
            raise XtrainError(f"--data {data}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        found = check_first_rows(source, path, DATA_KINDS[args.objective])
        sources.append(asked | ({"format": found} if DATA_KINDS[args.objective] == "chats" else {}))
    try:
        recipe = Recipe.model_validate({"model": model_setting(args.model, args.cwd), "data": {"sources": sources},
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
    print(f"wrote {out} ({found}); build it with `xtrain run {args.name}`")
    return 0


def run(args: argparse.Namespace) -> int:
    """Snakemake on the recipes' gates (everything up to them) and exports (for recipes with an `export:` section);
    every recipe (rule all) when none is named."""
    selection = selected(args.recipes, args.cwd)
    targets = [target for name in selection.names if args.recipes for target in (
        f"reports/{name}/gate.json", *([f"exports/{name}"] if has_export(selection, name) else []))]
    return build(args, selection, targets)


def evaluate(args: argparse.Namespace) -> int:
    """Snakemake up to each recipe's evaluation and report (reports/<recipe>/eval.json, report.html)."""
    selection = selected(args.recipes, args.cwd)
    return build(args, selection, [f"reports/{name}/{file}" for name in selection.names
                                   for file in ("eval.json", "report.html")])


def export(args: argparse.Namespace) -> int:
    """Snakemake up to each recipe's export (exports/<recipe>); a recipe without an `export:` section is refused."""
    selection = selected(args.recipes, args.cwd)
    if missing := [name for name in selection.names if not has_export(selection, name)]:
        raise XtrainError(f"{selection.path(missing[0])} has no `export:` section: add one, e.g. `export: {{gguf: "
                          "[q8_0]}` (docs/recipe.md#export)")
    return build(args, selection, [f"exports/{name}" for name in selection.names])


def chat(args: argparse.Namespace) -> int:
    """Talk to a recipe's checkpoint (built first when missing or stale), or to a folder (checkpoint, export or
    model) as it is, with `xtrain.chat`."""
    from . import chat as chat_module

    folder = args.cwd / args.recipe
    if "/" in args.recipe and folder.is_dir():  # a bare word is a recipe's name, even beside a folder of that name
        target = inside(folder)
    else:
        selection = selected([args.recipe], args.cwd)
        target = Path("checkpoints") / selection.names[0]
        code = build(args, selection, [str(target)])
        if code != 0:
            return code
    options = [*(["--system", args.system] if args.system else []), "--max-new-tokens", str(args.max_new_tokens),
               "--temperature", str(args.temperature), *(["--device", args.device] if args.device else [])]
    return chat_module.main([str(target), *options])


def smoke(args: argparse.Namespace) -> int:
    """Snakemake on smoke/<recipe> for each named recipe; prints each report.md."""
    selection = selected(args.recipes, args.cwd)
    code = build(args, selection, [f"smoke/{name}" for name in selection.names])
    for name in selection.names:
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
    for line in recipe_changes(names):
        print(line)
    return 0


def recipe_changes(names: list[str]) -> list[str]:
    """Field by field, what each recipe changed since its stages were built, and the recipes built on it that this
    makes stale (xtrain.staleness)."""
    from .recipe import load_recipe
    from .staleness import what_changed

    recipes = {path.stem: load_recipe(path) for path in sorted(RECIPES.glob("*.yaml"))}
    return [line for name in names for line in what_changed(name, recipes)]


def plan(args: argparse.Namespace) -> int:
    """The recipe's plan as a table (built first when it is missing or stale)."""
    from .plan import read_plan

    selection = selected([args.recipe], args.cwd)
    (name,) = selection.names
    path = Path(f"plans/{name}/plan.json")
    built = subprocess.run([*snakemake_command(), str(path), *selection.config(), "--cores", "all"],
                           capture_output=True, text=True)
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
        *([("generation", f"{result.generation.completions_per_device} completions per device, up to "
                          f"{result.generation.completion_tokens} tokens, KV cache {size(result.generation.kv_cache_bytes)}, "
                          f"peak {size(result.generation.peak_bytes_per_device)}, "
                          f"{result.generation.seconds_per_step:.3g} s per step")] if result.generation else []),
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


PASSED = "Arguments after -- go to snakemake as they are."
RECIPE_HELP = "a recipe: its name in recipes/ (demo), or the path of its .yaml file (recipes/showcase/x.yaml, ../mine.yaml)"
OUTSIDE = """A recipe outside recipes/ is read where it lies, never copied: Snakemake is pointed at its folder
(--config recipes=<folder>), so an edit to the file reruns what it affects, as for any recipe. The other .yaml files
of that folder are read too (an invalid one is only warned about). Paths inside a recipe are relative to the project
wherever the file is, and its outputs go where every recipe's go (checkpoints/<name>, reports/<name>), so its name
must differ from those in recipes/; recipes named together must lie in one folder."""


def parser() -> argparse.ArgumentParser:
    from .recipe import BACKENDS, OBJECTIVES, SOURCE_COLUMNS

    intro, _, rest = __doc__.partition("\n\n")
    top = argparse.ArgumentParser(prog="xtrain", description=" ".join(intro.split()), epilog=rest,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cores = argparse.ArgumentParser(add_help=False)
    cores.add_argument("--cores", default="all", help="CPU cores Snakemake may use (default: all)")
    building = argparse.ArgumentParser(add_help=False, parents=[cores])
    building.add_argument("--slurm", action="store_true", help="submit the jobs to Slurm (profiles/slurm)")
    building.add_argument("--dry-run", "-n", action="store_true", help="say what would run, and why; run nothing")

    def command(name: str, action, summary: str, examples: str, parents=(), aliases=(), more: str = ""):
        description = " ".join(action.__doc__.split()) if action.__doc__ else summary
        sub = commands.add_parser(name, aliases=list(aliases), help=summary, parents=list(parents),
                                  description=description + (f"\n\n{more}" if more else ""),
                                  epilog="examples:\n" + "\n".join(f"  {line}" for line in examples.splitlines()),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.set_defaults(action=action)
        return sub

    p = command("new", new, "write a recipe with the defaults shown and the data format detected",
                "xtrain new mine --model models/tiny-llama --data data/demo/chat.jsonl\n"
                "xtrain new gsm8k --model Qwen/Qwen2.5-0.5B-Instruct --data gsm8k.jsonl --format prompt_completion "
                "--columns prompt=question,completion=answer\n"
                "xtrain new prefs --model models/tiny-llama --data data/pref/colours_sums.jsonl --objective dpo")
    p.add_argument("name", help="the recipe's name: it writes recipes/NAME.yaml")
    p.add_argument("--model", required=True, help="a model folder (model.path), or a hub id org/name (model.hub), "
                   "read from the Hugging Face cache")
    p.add_argument("--data", required=True, action="append", help="a data file (repeat for several sources)")
    p.add_argument("--format", action="append", choices=tuple(SOURCE_COLUMNS), help="the rows' format (default: "
                   "detected from the first rows); once for every --data, or once per --data in their order")
    p.add_argument("--columns", action="append", metavar="OURS=THEIRS,...", help="the format's column names as the "
                   "file calls them, e.g. prompt=question,completion=answer (with no --format, the format reading "
                   "those names); once for every --data, or once per --data")
    p.add_argument("--objective", choices=OBJECTIVES, default="sft", help="the training objective (default: sft)")
    p.add_argument("--backend", choices=BACKENDS, default="trl_cpu", help="the training backend (default: trl_cpu)")
    p = command("run", run, "build recipes up to their gate, and their export (every recipe when none is named)",
                "xtrain run demo\nxtrain train recipes/showcase/smollm2_alpaca.yaml --cores 8\n"
                "xtrain run demo --dry-run\nxtrain run demo -- --keep-going", [building], ["train"], f"{PASSED}\n\n{OUTSIDE}")
    p.add_argument("recipes", nargs="*", metavar="RECIPE", help=RECIPE_HELP)
    p = command("eval", evaluate, "build recipes up to their evaluation and report",
                "xtrain eval demo\nxtrain eval ../mine.yaml", [building], more=f"{PASSED}\n\n{OUTSIDE}")
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help=RECIPE_HELP)
    p = command("export", export, "build recipes' exports (merged model, GGUF, Modelfile): exports/<recipe>",
                "xtrain export demo\nxtrain export demo --dry-run", [building], more=f"{PASSED}\n\n{OUTSIDE}")
    p.add_argument("recipes", nargs="+", metavar="RECIPE", help=RECIPE_HELP)
    p = command("chat", chat, "talk to a recipe's tuned model in the terminal (/reset starts over, /exit quits)",
                "xtrain chat demo\nxtrain chat exports/demo --temperature 0.7\n"
                "xtrain chat demo --system 'Answer in one sentence.'", [cores])
    p.add_argument("recipe", metavar="RECIPE|FOLDER", help=RECIPE_HELP + "; or a checkpoint, export or model folder")
    p.add_argument("--system", help="a system message opening every conversation")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest answer in tokens (default: 256)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="where the model runs (default: the GPU when there is one)")
    p = command("smoke", smoke, "rehearse recipes on the CPU in minutes (smoke/<recipe>/report.md)",
                "xtrain smoke demo\nxtrain smoke recipes/showcase/smollm2_alpaca.yaml", [cores])
    p.add_argument("recipes", nargs="*", metavar="RECIPE", help=RECIPE_HELP + " (default: every recipe in recipes/)")
    p = command("status", status, "each recipe's stages: done, missing, or stale and why",
                "xtrain status\nxtrain status demo")
    p.add_argument("recipes", nargs="*", metavar="RECIPE", help="a recipe name in recipes/ (default: every one)")
    p = command("plan", plan, "a recipe's plan (memory, layout, time, resources) as a table",
                "xtrain plan demo\nxtrain plan recipes/showcase/smollm2_alpaca.yaml")
    p.add_argument("recipe", metavar="RECIPE", help=RECIPE_HELP)
    command("compare", compare, "reports/compare.html: every recipe's metrics side by side", "xtrain compare")
    return top


# The commands that take snakemake's own arguments after --.
BUILDING = (run, evaluate, export)


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds the Snakefile."""
    return next((folder for folder in (start, *start.parents) if (folder / "Snakefile").is_file()), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passed = argv.index("--") if "--" in argv else len(argv)
    args = parser().parse_args(argv[:passed])
    args.snakemake = argv[passed + 1:]
    if args.snakemake and args.action not in BUILDING:
        print(f"xtrain {args.command}: takes no snakemake arguments after --", file=sys.stderr)
        return 1
    args.cwd = Path.cwd()
    root = project_root(args.cwd)
    if root is None:
        print(f"xtrain: no Snakefile in {args.cwd} or any folder above it; run xtrain inside a project folder",
              file=sys.stderr)
        return 1
    os.chdir(root)
    try:
        return args.action(args)
    except XtrainError as exc:
        print(f"xtrain {args.command}: {exc}", file=sys.stderr)
        return 1
    finally:
        os.chdir(args.cwd)


if __name__ == "__main__":
    sys.exit(main())
