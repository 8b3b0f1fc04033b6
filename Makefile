# Everything a fresh machine needs: `make test` and `make demo` create .venv and install the pinned stack.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-all demo reproduce cascade clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The default suite: offline, a few minutes on 2 cores. `make test-all` adds the slow tests.
test: install
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -n 2 $(PYTEST_ARGS)

test-all: install
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# The main job: HateSpeech end to end (embeddings are cached under ~/.cache/hf_defer); writes demo_model/.
# A quick form: make demo DEMO_ARGS="--max-rows 3000"
DEMO_ARGS ?=
demo: install
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/demo.py $(DEMO_ARGS)

# The paper's HateSpeech Table 2 (4 surrogates x 5 seeds) and the three-expert run, written to results/.
# Committed results are kept unless REPRODUCE_ARGS=--overwrite.
REPRODUCE_ARGS ?=
reproduce: install
	$(PY) scripts/reproduce_hatespeech.py --multi-expert $(REPRODUCE_ARGS)

# Cheap model, costly model and person on HateSpeech: cascade, router and deferral models in the error-cost plane
# (results/hatespeech_cascade.md). The costly stage (cross-fitted fine-tuning of MiniLM) is slow on a CPU; run it on a
# GPU with CASCADE_COSTLY_ARGS="--device cuda" or cap it, e.g. "--train-rows-per-fold 2000 --max-length 64".
CASCADE_COSTLY_ARGS ?= --folds 5 --epochs 2
cascade: install
	test -f results/hatespeech_costly_predictions.json || HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/cascade_hatespeech.py --stage costly $(CASCADE_COSTLY_ARGS)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/cascade_hatespeech.py --stage compare
