"""Arithmetic word problems for GRPO, GSM8K-style: a `question` and an `answer` that works it out and ends `#### n`.

    .venv/bin/python data/arithmetic/make_problems.py [--rows 600] [--seed 0] [--out data/arithmetic/problems.jsonl]
    .venv/bin/python data/arithmetic/make_problems.py --rows 1200 --seed 1 --exclude data/arithmetic/problems.jsonl \
        --out data/arithmetic/worked.jsonl

problems.jsonl is the GRPO showcase's prompts (and its held-out problems); worked.jsonl, problems none of which is in
problems.jsonl (`--exclude`), is what its SFT stage learns the worked answers from, so that no problem the GRPO stage
holds out was seen with its answer upstream.

Seeded and standard-library only: the same seed and row count write a byte-identical file (tests/test_grpo_demo.py
checks the committed file against a fresh run). Each problem is one of a few templates (add, take away, multiply,
share equally, two steps) with small whole numbers, so every answer is a whole number >= 0 and a 135M chat model
solves some of them but not all: a reward that checks the number has something to teach.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ["Ana", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kemal", "Lena", "Mia",
         "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "books", "stamps", "shells", "cards", "balloons",
         "oranges", "coins", "buttons", "flowers", "toy cars"]
INSTRUCTION = "Work it out, then give the final number on its own line after ####."

Problem = tuple[str, str, int]  # question, worked steps, answer


def add(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(3, 60), rng.randint(2, 40)
    return (f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
            f"{name} has {a} + {b} = {a + b} {item}.", a + b)


def take_away(rng: random.Random, name: str, item: str) -> Problem:
    a = rng.randint(10, 80)
    b = rng.randint(1, a - 1)
    return (f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?",
            f"{name} has {a} - {b} = {a - b} {item} left.", a - b)


def multiply(rng: random.Random, name: str, item: str) -> Problem:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return (f"{name} has {a} boxes with {b} {item} in each box. How many {item} does {name} have in all?",
            f"{a} boxes of {b} {item} make {a} * {b} = {a * b} {item}.", a * b)


def share(rng: random.Random, name: str, item: str) -> Problem:
    each, friends = rng.randint(2, 12), rng.randint(2, 9)
    total = each * friends
    return (f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?",
            f"Each friend gets {total} / {friends} = {each} {item}.", each)


def two_steps(rng: random.Random, name: str, item: str) -> Problem:
    packs, per_pack = rng.randint(2, 9), rng.randint(2, 10)
    total = packs * per_pack
    used = rng.randint(1, total - 1)
    return (f"{name} buys {packs} packs of {item} with {per_pack} in each pack, then gives away {used}. "
            f"How many {item} does {name} have now?",
            f"{name} buys {packs} * {per_pack} = {total} {item}, then has {total} - {used} = {total - used} left.",
            total - used)


TEMPLATES: list[Callable[[random.Random, str, str], Problem]] = [add, take_away, multiply, share, two_steps]


def problems(rows: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """`rows` distinct problems (the templates in turn), each {"question", "answer"}, none of whose questions is in
    `exclude`."""
    rng = random.Random(seed)
    seen = {question.removesuffix(f" {INSTRUCTION}") for question in exclude}
    out = []
    while len(out) < rows:
        template = TEMPLATES[len(out) % len(TEMPLATES)]
        question, steps, answer = template(rng, rng.choice(NAMES), rng.choice(ITEMS))
        if question in seen:
            continue
        seen.add(question)
        out.append({"question": f"{question} {INSTRUCTION}", "answer": f"{steps}\n#### {answer}"})
    return out


def write(path: Path, rows: int, seed: int, exclude: Path | None = None) -> None:
    excluded = frozenset(json.loads(line)["question"] for line in exclude.read_text(encoding="utf-8").splitlines()
                         ) if exclude else frozenset()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in problems(rows, seed, excluded)), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("problems.jsonl"))
    parser.add_argument("--exclude", type=Path, help="a file of problems none of which is to be written again")
    args = parser.parse_args()
    write(args.out, args.rows, args.seed, args.exclude)
    print(f"{args.out}: {args.rows} problems, seed {args.seed}" + (f", none of {args.exclude}" if args.exclude else ""))


if __name__ == "__main__":
    main()
