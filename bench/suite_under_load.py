"""The whole test suite while a CPU hog keeps every core busy: it must pass, run after run.

    .venv/bin/python bench/suite_under_load.py [--runs 2] [--no-hog]   # ~25-60 min a run on 2 cores

One Python busy loop per core (separate processes, so the GIL does not serialise them) runs for as long as
the suite does; the suite is `make test`'s pytest command. Prints one table row per run: whether the hog
ran, the exit code, the passed/failed counts and the wall time, for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = [str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-n", "2", "--dist", "loadfile", "-q", "-rf", "-p",
         "no:cacheprovider"]


def spin() -> None:
    while True:
        pass


def run_suite() -> tuple[int, str, float]:
    started = time.perf_counter()
    result = subprocess.run(SUITE, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    lines = result.stdout.splitlines()
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), "")
    failed = [line.removeprefix("FAILED ").split(" - ")[0] for line in lines if line.startswith("FAILED ")]
    return result.returncode, summary.strip("= ") + (f" ({', '.join(failed)})" if failed else ""), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-hog", action="store_true", help="run the suite on a quiet machine, for comparison")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores\n| run | CPU hog | exit | result | wall |\n| --- | --- | --- | --- | --- |")
    failed = False
    for run in range(1, args.runs + 1):
        hogs = [] if args.no_hog else [multiprocessing.Process(target=spin, daemon=True) for _ in range(os.cpu_count() or 1)]
        for hog in hogs:
            hog.start()
        try:
            code, summary, seconds = run_suite()
        finally:
            for hog in hogs:
                hog.terminate()
        failed |= code != 0
        print(f"| {run} | {'no' if args.no_hog else f'{len(hogs)} busy loops'} | {code} | {summary} | "
              f"{seconds / 60:.1f} min |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
