# Two commands for a newcomer: `make demo` runs the main job on its built-in default,
# `make test` runs the test suite. Both create and use a local virtual environment.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) examples/data_preprocess/gsm8k.py --local_dataset_path examples/data_preprocess/fixtures/gsm8k --local_dir demo_output/gsm8k

clean:
	rm -rf $(VENV) demo_output
