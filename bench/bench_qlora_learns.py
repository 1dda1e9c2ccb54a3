"""Does a QLoRA run of the 27M model learn? Its loss through the real train stage, on bench_plan_real's rows.

    .venv/bin/python bench/bench_qlora_learns.py [--learning-rate 2e-3] [--steps 48]   # ~1 min on 2 cores

The 27M Llama of bench_plan (random-init, demo tokenizer), QLoRA (the default nf4, double-quantized, LoRA on q/k/v/o)
through trl_cpu on bench_plan_real's rows: random ids 10-999 of a 16,384-token vocabulary at seq_len 256, which a
model learns by moving its output toward those ids. At bench_plan_real's default learning rate (2e-4) its 24 steps do
not show it; a higher rate over more steps does. Prints the first and last logged loss and the peak RSS.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench_plan_real import model_with_tokenizer, train_and_measure, varied_rows  # (it puts src/ on the path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    from xtrain.recipe import Train

    with tempfile.TemporaryDirectory(prefix="xtrain-learns-qlora-") as folder:
        work = Path(folder)
        model = model_with_tokenizer(work)
        manifest = varied_rows(work / "prepared", 256)
        train = Train(method="qlora", global_batch_size=8, max_steps=args.steps, report_to=[], logging_steps=4,
                      learning_rate=args.learning_rate)
        result = train_and_measure(model, work / "prepared", manifest, train, work)
    print(f"27M QLoRA, {args.steps} steps at learning rate {args.learning_rate:g}: loss {result['loss']}, "
          f"peak RSS {result['peak_mib']:,.0f} MiB, {result['measured']:.0f} s of training")


if __name__ == "__main__":
    main()
