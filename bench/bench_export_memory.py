"""Peak memory of the export stage (issue 34): the merge and save of merged/, and writing one GGUF file, against
the model's size in its dtype and the largest shard of merged/.

    .venv/bin/python bench/bench_export_memory.py [--before-src /tmp/export-before/src] [--work DIR]
        [--models smollm2,synthetic]   # ~15 min on 2 busy cores with --before-src; prints the table for BENCHMARKS.md

Two models, each with a LoRA adapter (r 8 on q/v, random nonzero B so the merge changes every targeted weight)
saved as a checkpoint with the files export reads (adapter, tokenizer, generation_config.json, manifest.json,
train_metrics.json) and the demo data prepared for its tokenizer:
- smollm2: models/SmolLM2-135M-Instruct (float32; `make showcase`, then `snakemake models/SmolLM2-135M-Instruct`);
- synthetic: a random-init Llama shaped like a 1B model (hidden 2048, 16 layers, 32 heads, 8 kv heads,
  intermediate 8192, vocab 32000: 1.1B parameters) in bfloat16, saved in ~500 MB shards, with the demo model's
  tokenizer (built as rule build_tiny_model builds it).
Each measurement is a fresh interpreter (its peak RSS is its own VmHWM: ru_maxrss would carry the parent's peak
across fork and exec), `export.shard_gb` 0.5:
- merge: `export()` with merged/ only (load, merge, save merged/);
- export <type>: `export()` with one GGUF type and no merged/ (the whole stage for one GGUF file);
- writer <type>: `write_gguf` alone, from the merge's merged/ (the code under test only: the writer before issue
  34 took the merged model in memory, so its peak is the export row's).
With `--before-src` (the `src` folder of a checkout of the code before the change, e.g. `git worktree add
/tmp/export-before <commit>`) the merge and export rows are measured for that code too. Targets of the issue: merge
<= 1.3 x the model's size in its dtype + 1 GiB; GGUF writer <= 1.5 x the largest shard + 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
SMOLLM2 = ROOT / "models/SmolLM2-135M-Instruct"
GIB, MIB = 2**30, 2**20
SHARD_GB = 0.5
KINDS = ("f16", "q8_0")
CHILD = """
import json, re, sys, time
from pathlib import Path
started = time.perf_counter()
stage, work, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
settings = json.loads(sys.argv[4])
if stage == "imports":
    import gguf, peft, torch, transformers
    from xtrain.export import export
elif stage == "writer":
    from xtrain.export.gguf_file import write_gguf
    write_gguf(work / "merged", work / "checkpoint", out, settings["gguf"][0], out.stem, None)
else:
    from xtrain.export import export
    from xtrain.recipe import Export, Hardware, Train
    export(model_dir=work / "base", checkpoint_dir=work / "checkpoint", prepared_dir=work / "prepared", evaluation={},
           settings=Export(**settings), train=Train(), hardware=Hardware(), out=out)
peak = int(re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text())[1]) * 1024
print(json.dumps({"peak_rss": peak, "wall": time.perf_counter() - started}))
"""


def synthetic_base(out: Path, tokenizer_dir: Path):
    """The 1B-shaped bfloat16 Llama, saved in ~500 MB shards with the demo tokenizer; returns the model."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size="500MB")
    tokenizer.save_pretrained(out)
    return model


def checkpoint(work: Path, model) -> None:
    """work/checkpoint: a LoRA adapter of `model` (whose folder is work/base) and the files export reads, and
    work/prepared: the demo data prepared for its tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from xtrain.data import prepare
    from xtrain.recipe import Data, DataSource

    torch.manual_seed(0)
    adapter = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                               init_lora_weights=False))
    adapter.save_pretrained(work / "checkpoint")
    AutoTokenizer.from_pretrained(work / "base").save_pretrained(work / "checkpoint")
    shutil.copyfile(work / "base/generation_config.json", work / "checkpoint/generation_config.json")
    (work / "checkpoint/manifest.json").write_text(json.dumps({"base_model": work.name, "backend": "trl_cpu"}))
    (work / "checkpoint/train_metrics.json").write_text(json.dumps({"steps": 0, "tokens_seen": 0, "final_loss": None}))
    data = Data(sources=[DataSource(path=str(ROOT / "data/demo/chat.jsonl"))], seq_len=128, eval_fraction=0.1)
    prepare([ROOT / "data/demo/chat.jsonl"], work / "base", data, work / "prepared")


def build(work: Path, name: str) -> Path:
    """work/<name>/ with base, checkpoint and prepared (kept: a rerun with the same --work reuses them)."""
    import torch
    import yaml
    from transformers import AutoModelForCausalLM

    from xtrain.models.tiny import build_tiny_model

    folder = work / name
    if (folder / "prepared").is_dir():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if name == "smollm2":
        shutil.copytree(SMOLLM2, folder / "base")
        model = AutoModelForCausalLM.from_pretrained(folder / "base", dtype=torch.float32)
    else:
        settings = yaml.safe_load((ROOT / "config/config.yaml").read_text())["tiny_model"]
        (work / "tiny").mkdir(exist_ok=True)
        build_tiny_model(ROOT / settings["corpus"], work / "tiny", **settings["settings"])
        model = synthetic_base(folder / "base", work / "tiny")
    checkpoint(folder, model)
    return folder


def measure(folder: Path, src: Path, stage: str, settings: dict) -> dict:
    out = folder / f"out-{stage}" / folder.name
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(src)}
    result = subprocess.run([sys.executable, "-c", CHILD, stage, str(folder), str(out), json.dumps(settings)],
                            capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode:
        sys.exit(f"{folder.name} {stage} ({src}) failed:\n{result.stderr[-3000:]}")
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    if stage == "merge" and src == ROOT / "src":  # the writer rows read this merged/
        shutil.rmtree(folder / "merged", ignore_errors=True)
        (out / "merged").rename(folder / "merged")
    shutil.rmtree(out.parent, ignore_errors=True)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before-src", type=Path, help="src/ of the code before the change, measured too")
    parser.add_argument("--work", type=Path, help="a folder of an earlier run: its models and checkpoints are reused")
    parser.add_argument("--models", default="smollm2,synthetic")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-export-memory-"))
    codes = {"after": ROOT / "src", **({"before": args.before_src.resolve()} if args.before_src else {})}
    rows = []
    for name in args.models.split(","):
        if name == "smollm2" and not SMOLLM2.is_dir():
            print(f"skipped smollm2: {SMOLLM2} is missing (`make showcase`)", file=sys.stderr)
            continue
        started = time.perf_counter()
        folder = build(work, name)
        print(f"{name}: built in {time.perf_counter() - started:.0f} s in {folder}", file=sys.stderr)
        stages = [("imports", {}),
                  ("merge", {"merged": True, "shard_gb": SHARD_GB}),
                  *((f"export {kind}", {"merged": False, "gguf": [kind], "shard_gb": SHARD_GB}) for kind in KINDS),
                  *((f"writer {kind}", {"gguf": [kind]}) for kind in KINDS)]
        for code, src in codes.items():
            for stage, settings in stages:
                if stage.startswith("writer") and code != "after":
                    continue
                measured = measure(folder, src, stage.split()[0], settings)
                rows.append({"model": name, "code": code, "stage": stage, **measured})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        shards = [path.stat().st_size for path in (folder / "merged").glob("*.safetensors")]
        for row in rows:
            if row["model"] == name:
                row |= {"model_bytes": sum(shards), "largest_shard": max(shards)}
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    print("| model (size in its dtype, largest shard) | part | before: peak RSS (MiB) | after: peak RSS (MiB) | "
          "target (MiB) | after: wall (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if row["code"] != "after":
            continue
        before = next((r for r in rows if r["code"] == "before" and r["model"] == row["model"]
                       and r["stage"] == row["stage"]), None)
        merge_target = 1.3 * row["model_bytes"] + GIB
        target = {"imports": None, "merge": merge_target, "writer": 1.5 * row["largest_shard"] + GIB}.get(
            row["stage"].split()[0], merge_target)  # export rows merge first, so the merge's bound is theirs
        mib = [f"{value / MIB:.0f}" if value else "-" for value in (before and before["peak_rss"], target)]
        print(f"| {row['model']} ({row['model_bytes'] / 1e9:.2f} GB, {row['largest_shard'] / 1e9:.2f} GB) | "
              f"{row['stage']} | {mib[0]} | {row['peak_rss'] / MIB:.0f} | {mib[1]} | {row['wall']:.1f} |")


if __name__ == "__main__":
    main()
