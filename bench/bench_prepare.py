"""Benchmark of the prepare stage (not a test): speed and memory on 50,000 alpaca rows, packing efficiency.

    .venv/bin/python bench/bench_prepare.py

1. 50,000 alpaca rows are made from data/real/alpaca_en_demo.json: copy 0 is the file as it is, every
   other copy shuffles the words of each field (same vocabulary and lengths, but distinct rows, so dedupe
   keeps them and every row is tokenized). They are prepared three times, each in its own process whose
   peak memory is sampled: by `prepare` (batched fast tokenization), by a per-row loop calling
   `apply_chat_template` one example at a time, and by TRL's `SFTTrainer` (its own dataset preparation:
   template, tokenization, assistant masks, packing; what users otherwise run). With the demo's tokenizer
   (byte-level BPE, 1k vocab), and with SmolLM2's (49k vocab) when its folder exists (`.venv/bin/snakemake --cores 1 models/SmolLM2-135M-Instruct`),
   both rendering the ChatML template the demo uses.
2. alpaca_en_demo.json is prepared at seq_len 1024 with and without packing: packing efficiency beside
   the padding a batch would carry without packing.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
ALPACA = ROOT / "data/real/alpaca_en_demo.json"
SMOLLM2 = ROOT / "models/SmolLM2-135M-Instruct"
ROWS = 50_000
SEQ_LEN = 1024


def make_rows(path: Path) -> None:
    real = json.loads(ALPACA.read_text())
    rows = []
    for copy in range(-(-ROWS // len(real))):
        rng = random.Random(copy)
        for row in real:
            if copy:
                row = {k: " ".join(rng.sample(v.split(), len(v.split()))) for k, v in row.items()}
            rows.append(row)
    path.write_text(json.dumps(rows[:ROWS]))


def run_prepare(rows: Path, model: Path, out: Path) -> None:
    from xtrain.data import prepare
    from xtrain.recipe import Data, DataSource

    data = Data(sources=[DataSource(path=str(rows))], seq_len=SEQ_LEN, packing=True, chat_template="chatml")
    prepare([rows], model, data, out)


def alpaca_chat(row: dict) -> list[dict]:
    prompt = f"{row['instruction']}\n{row['input']}" if row["input"] else row["instruction"]
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": row["output"]}]


def run_loop(rows: Path, model: Path, out: Path) -> None:
    """The baseline: read, build each chat, tokenize it alone with its assistant mask."""
    from transformers import AutoTokenizer

    from xtrain.models.tiny import CHATML_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model)
    encoded = []
    for row in json.loads(rows.read_text()):
        out_row = tokenizer.apply_chat_template(alpaca_chat(row), chat_template=CHATML_TEMPLATE, tokenize=True,
                                                return_dict=True, return_assistant_tokens_mask=True)
        encoded.append((out_row["input_ids"], out_row["assistant_masks"]))
    print(f"loop tokenized {len(encoded)} rows", file=sys.stderr)


def run_trl(rows: Path, model: Path, out: Path) -> None:
    """What users otherwise run: TRL's SFTTrainer preparing the chats itself (template, tokenization, assistant
    masks from the template's generation blocks, packing to seq_len), as its constructor does; the model it is
    given is a one-layer stand-in (its preparation does not use the model)."""
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from xtrain.models.tiny import CHATML_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHATML_TEMPLATE
    stand_in = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    dataset = Dataset.from_list([{"messages": alpaca_chat(row)} for row in json.loads(rows.read_text())])
    args = SFTConfig(output_dir=str(out), assistant_only_loss=True, packing=True, max_length=SEQ_LEN, report_to=[],
                     use_cpu=True)
    trainer = SFTTrainer(model=stand_in, args=args, train_dataset=dataset, processing_class=tokenizer)
    print(f"trl prepared {len(trainer.train_dataset)} packed rows", file=sys.stderr)


def measure(mode: str, rows: Path, model: Path, out: Path) -> tuple[float, int]:
    """Wall seconds of the work (imports excluded) and peak memory of the process tree."""
    child = subprocess.Popen([sys.executable, __file__, mode, str(rows), str(model), str(out)],
                             stdout=subprocess.PIPE, text=True)
    process, peak = psutil.Process(child.pid), 0

    def sample() -> None:
        nonlocal peak
        while child.poll() is None:
            try:
                tree = [process, *process.children(recursive=True)]
                # PSS: pages shared with forked workers are counted once, not once per process.
                peak = max(peak, sum(p.memory_full_info().pss for p in tree))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    stdout, _ = child.communicate()
    sampler.join()
    if child.returncode:
        raise SystemExit(f"{mode} failed")
    return float(stdout.strip().splitlines()[-1]), peak


def child_main(mode: str, rows: str, model: str, out: str) -> None:
    # Imports are a one-off cost outside the per-row work: every side loads its own before the clock starts.
    import trl.data_utils  # noqa: F401
    from trl import SFTTrainer  # noqa: F401

    import xtrain.data  # noqa: F401

    started = time.perf_counter()
    {"prepare": run_prepare, "loop": run_loop, "trl": run_trl}[mode](Path(rows), Path(model), Path(out))
    print(time.perf_counter() - started)


def padding_report(model: Path, work: Path) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    from xtrain.data import prepare
    from xtrain.recipe import Data, DataSource

    results = {}
    for packing in (True, False):
        data = Data(sources=[DataSource(path=str(ALPACA))], seq_len=SEQ_LEN, packing=packing)
        results[packing] = prepare([ALPACA], model, data, work / f"alpaca-{packing}")["splits"]["train"]
    lengths = np.array([len(r) for r in pq.read_table(work / "alpaca-False/train.parquet")["input_ids"].to_pylist()])
    shuffled = np.random.default_rng(0).permutation(lengths)

    def padding(batches) -> float:
        return 1 - lengths.sum() / sum(len(b) * b.max() for b in batches)

    return {
        "packing_efficiency": results[True]["packing_efficiency"],
        "packed_rows": results[True]["rows"],
        "examples": results[True]["examples"],
        "padding_unpacked_to_seq_len": results[False]["padding_fraction_unpacked"],
        "padding_unpacked_random_batches_of_8": round(padding(np.array_split(shuffled, len(lengths) // 8)), 4),
        "padding_unpacked_length_sorted_batches_of_8": round(
            padding(np.array_split(np.sort(lengths), len(lengths) // 8)), 4),
    }


def main() -> None:
    from xtrain.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "tiny-llama"
        model.mkdir()
        build_tiny_model(ROOT / "data/tiny-llama/corpus.txt", model)
        rows = work / "alpaca_50k.json"
        make_rows(rows)
        tokenizers = {"demo (byte-level BPE, 1k vocab)": model}
        if (SMOLLM2 / "tokenizer.json").is_file():
            tokenizers["SmolLM2 (49k vocab)"] = SMOLLM2
        report = {"rows": ROWS}
        for name, tokenizer_model in tokenizers.items():
            out = work / f"prepared-{len(report)}"
            prepare_s, prepare_peak = measure("prepare", rows, tokenizer_model, out)
            loop_s, loop_peak = measure("loop", rows, tokenizer_model, work / "loop")
            trl_s, trl_peak = measure("trl", rows, tokenizer_model, work / "trl")
            manifest = json.loads((out / "manifest.json").read_text())
            report[name] = {
                "prepare_seconds": round(prepare_s, 1),
                "prepare_peak_pss_gib": round(prepare_peak / 2**30, 2),
                "loop_seconds": round(loop_s, 1),
                "loop_peak_pss_gib": round(loop_peak / 2**30, 2),
                "speedup": round(loop_s / prepare_s, 2),
                "trl_sft_trainer_seconds": round(trl_s, 1),
                "trl_sft_trainer_peak_pss_gib": round(trl_peak / 2**30, 2),
                "speedup_over_trl": round(trl_s / prepare_s, 2),
                "kept": next(iter(manifest["sources"].values()))["kept"],
                "train_tokens": manifest["splits"]["train"]["tokens"],
            }
        report["alpaca_en_demo_seq_len_1024"] = padding_report(model, work)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 5:
        child_main(*sys.argv[1:])
    else:
        main()
