"""How long the plan's memory trace takes, and what it gives: a grid of traced steps, timed, its results kept.

    .venv/bin/python bench/bench_trace.py run OUT.pkl        # 320 traces, ~6 min on 2 cores at ad802f0
    .venv/bin/python bench/bench_trace.py compare A.pkl B.pkl  # which traces differ between two runs, and how

Run it at two commits to compare a change to `xtrain.plan.memory._traced`: same grid, same models. The grid is the
traces a plan asks for (`_traced` of the model or of its 2- and 3-layer copies), both methods, fp32 and bf16, with and
without checkpointing, unpacked, packed and DPO pairs, on the published Llama-3.1-8B and Qwen3-8B configs
(tests/data/model_configs; 16-bit and unpacked only, as GPU plans trace them), and on the demo's tiny Llama
(`make demo`) and SmolLM2-135M (`make showcase-model`), each left out with a message where it is not there. No
weights are read.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xtrain.plan.memory import Step, _traced  # noqa: E402
from xtrain.recipe import Train  # noqa: E402

PUBLISHED = ("Llama-3.1-8B-Instruct", "Qwen3-8B")
LOCAL = {"tiny-llama": ROOT / "models" / "tiny-llama", "SmolLM2-135M": ROOT / "models" / "SmolLM2-135M-Instruct"}


def models(folder: Path) -> dict[str, tuple[str, bool]]:
    """name -> (model folder, whether it is a GPU-sized model)."""
    found = {}
    for name, path in LOCAL.items():
        if (path / "config.json").is_file():
            found[name] = (str(path), False)
        else:
            print(f"{path}: not there, left out")
    for name in PUBLISHED:
        (folder / name).mkdir()
        shutil.copy(ROOT / "tests" / "data" / "model_configs" / f"{name}.json", folder / name / "config.json")
        found[name] = (str(folder / name), True)
    return found


def grid(big: bool):
    """(method, step, layers) of each trace of one model."""
    for method in ("lora", "full"):
        for precision in ("fp32", "bf16"):
            if big and precision == "fp32":
                continue
            weights = "bf16" if method == "lora" and precision == "bf16" else "fp32"
            for checkpointing in (False, True):
                for packed, sequences, micro in ((False, 1, 2), (True, 1, 2), (False, 2, 1)):
                    if big and packed:
                        continue
                    step = Step(micro, 64 if big else 128, precision, weights, checkpointing, sequences, packed)
                    for layers in (2, 3) if big else (None, 2, 3):
                        yield method, step, layers


def run(out: Path) -> None:
    lora = Train(method="lora").lora.model_dump_json()
    results, started = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for name, (model, big) in models(Path(folder)).items():
            for method, step, layers in grid(big):
                traced = _traced(model, method, lora if method == "lora" else None, step, False, layers)
                results[(name, method, step, layers)] = traced.trace
    seconds = time.perf_counter() - started
    out.write_bytes(pickle.dumps(results))
    print(f"{len(results)} traces in {seconds:.1f} s ({seconds / len(results):.2f} s each); results in {out}")


def compare(first: Path, second: Path) -> None:
    a, b = pickle.loads(first.read_bytes()), pickle.loads(second.read_bytes())
    same = {"breakdown": 0, "flops": 0, "ops": 0}
    for key in a.keys() & b.keys():
        for figure in same:
            same[figure] += getattr(a[key], figure) == getattr(b[key], figure)
    print(f"{len(a.keys() & b.keys())} traces in both: identical " + ", ".join(f"{k} {v}" for k, v in same.items()))
    for key in sorted(a.keys() & b.keys(), key=str):
        old, new = a[key], b[key]
        if old.breakdown != new.breakdown:
            total = sum(new.breakdown.values()) / sum(old.breakdown.values())
            moved = {kind: new.breakdown[kind] - old.breakdown[kind] for kind in old.breakdown
                     if new.breakdown[kind] != old.breakdown[kind]}
            print(f"  {key[0]} {key[1]} {key[2]} layers={key[3]}: peak x{total:.5f}, bytes moved {moved}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("run").add_argument("out", type=Path)
    both = commands.add_parser("compare")
    both.add_argument("first", type=Path)
    both.add_argument("second", type=Path)
    args = parser.parse_args()
    run(args.out) if args.command == "run" else compare(args.first, args.second)


if __name__ == "__main__":
    main()
