#!/usr/bin/env bash
# The GPU check in one call on the machine with one NVIDIA GPU (issues 19, 34): installs the carried wheels beside the
# image's own packages, runs bench/gpu_check.py (the demo and a 0.5B-shaped recipe on trl_local through every stage:
# prepare, plan, train with the checkpoint checked by the contract, evaluate on its job plan, and for the demo export;
# each stage's time and memory against its plan) and prints its Markdown table, also into $OUT/gpu_check.md (and the
# log into $OUT/gpu_check.log) when $OUT is set.
#
#   make gpu-wheels                  # here, once: bench/.gpu_wheels (~19 MiB; the tree travels with it, 64 MiB in all)
#   device run, carry ["bench/.gpu_wheels"], timeout_s 600:  bash bench/gpu_check.sh
#   bash bench/gpu_check.sh --device cpu --steps 2   # the plumbing on a CPU, from a Python lacking the wheels' packages
#
# Arguments go to bench/gpu_check.py. The image's python3 keeps its torch 2.11, transformers 5.17 and the rest
# untouched: the wheels go into their own folder, first on PYTHONPATH, so xtrain sees transformers 5.24 and TRL 1.16
# there. Exit status: gpu_check.py's (1: a stage failed, broke the contract or missed its memory), 2 when
# the wheels cannot be installed, 124 when the run passes GPU_CHECK_SECONDS (default 480: the call's 10 minutes
# leave room for the machine's start and the transfers); the table so far is printed in every case.
#
# axolotl, unsloth and torchtune do not run here: their stacks are not in the image. torchtune's could be carried:
# torchtune 0.6.1, torchao 0.11.0, torchdata 0.11.0, omegaconf, blobfile, pycryptodomex, kagglehub, kagglesdk,
# truststore, httpx2 and httpcore2 are ~9.3 MiB of Python 3.12 wheels beyond bench/.gpu_wheels (whose datasets,
# dill, multiprocess and fsspec it shares), and none pins torch (torchao 0.11 skips its C++ kernels on a torch other
# than the one it was built for, as the CPU lane already runs it on torch 2.13), so adding them to GPU_PACKAGES
# with envs/torchtune-cuda.lock's versions would let gpu_check.py train a torchtune row too. Not built yet.
set -uo pipefail
cd "$(dirname "$0")/.."

wheels=bench/.gpu_wheels site=/tmp/xtrain-site
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
  echo "bench/gpu_check.sh: no wheels in $wheels: run \`make gpu-wheels\` where PyPI is reachable and carry $wheels" >&2
  exit 2
fi
python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target "$site" "$wheels"/*.whl || exit 2

# The torchrun workers inherit this environment; there is no network, so the hub libraries never try it.
export PYTHONPATH="$site:$PWD/src" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  HF_HUB_DISABLE_PROGRESS_BARS=1
table=${OUT:-$(mktemp -d)}/gpu_check.md
log=${OUT:+$OUT/gpu_check.log}
timeout --signal=INT --kill-after=30 "${GPU_CHECK_SECONDS:-480}" python3 bench/gpu_check.py "$@" \
  2> >(tee ${log:+"$log"} >&2) | tee "$table"
status=${PIPESTATUS[0]}
# Once more at the end, after the log lines it was interleaved with.
printf '\n' && cat "$table"
exit "$status"
