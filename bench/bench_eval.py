"""Batched evaluation vs one row at a time: held-out loss of 2,000 eval rows on the demo's tiny model.

    .venv/bin/python bench/bench_eval.py [--threads N]   # ~1 min on 2 quiet cores; prints the table for BENCHMARKS.md

The model is the demo's (built offline, as rule build_tiny_model builds it); the 2,000 rows are the demo
chats rendered with its chat template and masked as prepare masks them (the 400 demo chats, each used
five times, mixed). Both sides run `xtrain.evaluate.loss.supervised_nll`, the evaluate stage's own code, with
`eval.batch_size` 1 and then the batch sizes given; both must give the same loss.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
ROWS = 2000
BATCH_SIZES = (1, 8, 16, 32, 64)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    if (threads := parser.parse_args().threads) is not None:
        # On a machine shared with other jobs, more threads than free cores make every side slower.
        torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xtrain.data.tokenize import encode_chats
    from xtrain.evaluate.loss import supervised_nll
    from xtrain.models.tiny import build_tiny_model

    settings = yaml.safe_load((ROOT / "config/config.yaml").read_text())["tiny_model"]
    folder = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    build_tiny_model(ROOT / settings["corpus"], folder, **settings["settings"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    chats = [json.loads(line)["messages"] for line in (ROOT / "data/demo/chat.jsonl").read_text().splitlines()]
    chats = (chats * (ROWS // len(chats) + 1))[:ROWS]
    random.Random(0).shuffle(chats)
    encoded = encode_chats(tokenizer, tokenizer.chat_template, chats, [None] * len(chats))
    ids, masks = [i for i, _ in encoded], [m for _, m in encoded]
    print(f"{ROWS} rows, {sum(map(len, ids))} tokens, {torch.get_num_threads()} threads")
    results = {}
    for batch_size in BATCH_SIZES:
        start = time.perf_counter()
        total, count = supervised_nll(model, ids, masks, batch_size, tokenizer.pad_token_id)
        results[batch_size] = (time.perf_counter() - start, total / count)
    one = results[1][0]
    print("| eval.batch_size | wall (s) | rows/s | speed-up vs 1 | loss |")
    print("| --- | --- | --- | --- | --- |")
    for batch_size, (seconds, loss) in results.items():
        print(f"| {batch_size} | {seconds:.2f} | {ROWS / seconds:.0f} | {one / seconds:.1f}× | {loss:.6f} |")
    losses = [loss for _, loss in results.values()]
    assert max(losses) - min(losses) < 1e-4 * abs(losses[0]), "batched and single-row losses differ"


if __name__ == "__main__":
    main()
