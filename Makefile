# Two commands for a newcomer: `make demo` runs the main job on its built-in default,
# `make test` runs the test suite. Both create and use a local virtual environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TRITON_STAMP := $(VENV)/.triton

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# Tests only: Triton runs the GPU sampler's kernels on the CPU (its interpreter); a CUDA torch brings its own.
$(TRITON_STAMP): $(STAMP)
	$(PY) -c "import triton" 2>/dev/null || $(PY) -m pip install --quiet triton==3.6.0 || \
		echo "triton unavailable here: its interpreter tests will be skipped"
	touch $(TRITON_STAMP)

venv: $(STAMP)

test: $(TRITON_STAMP)
	$(PY) -m pytest -q tests

# make demo [SEED=1]: data, tiny model, SFT warm start, GRPO with Ray on CPU, export, plots, summary.
SEED ?= 0
DEMO_START := $(shell date +%s)

demo: $(STAMP)
	$(PY) examples/demo/run_demo.py --seed $(SEED) --output_dir demo_output --started_at $(DEMO_START)

clean:
	rm -rf $(VENV) demo_output
