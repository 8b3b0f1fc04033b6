# Everything a fresh machine needs: `make test` and `make demo` create .venv and install the pinned stack.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-all test-slow test-explore lint demo reproduce cascade mmlu-routing convabuse guarantees clean
.PHONY: monitoring
.PHONY: test-latest test-oldest review-server review-demo test-review docs docs-serve test-docs

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

# The linter ([tool.ruff] in pyproject.toml: pyflakes and pycodestyle's errors, 120 columns) over the whole checkout.
# It only checks: nothing is rewritten (`ruff format` is not run over the tree).
lint: install
	$(VENV)/bin/ruff check .

# The slow tests alone (several processes, FSDP, end-to-end experiment runs): CI runs them after `make test`.
test-slow: install
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -m slow -n 2 $(PYTEST_ARGS)

# Before a release: the hypothesis tests with random draws and ten times the examples (tests/hypothesis_profiles.py);
# `make test` is derandomized, the same examples on every machine. Each failure found here becomes an @example.
# (`-m hypothesis`: the marker hypothesis' pytest plugin gives every @given test.)
test-explore: install
	HYPOTHESIS_PROFILE=explore HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest -m "hypothesis and not slow" -n 2 \
		$(PYTEST_ARGS)

# The default suite on two more stacks than constraints.txt's, each in its own venv and without the constraints file
# (README, "Installing"): test-latest on the newest releases the package index offers today (upgraded at every run, as
# `pip install hf-defer[peft]` would get them), test-oldest on the lowest versions pyproject.toml allows (uv resolves
# them: --resolution lowest-direct). torch is pinned to wheels on this machine's disk, since an unpinned torch pulls a
# multi-GB CUDA build: LATEST_TORCH is the newest there (a CUDA build, ~6 GB in the venv, no download), the oldest
# stack takes pyproject's lower bound (2.13.0, the CPU build).
LATEST_VENV ?= .venv-latest
LATEST_TORCH ?= 2.14.1
OLDEST_VENV ?= .venv-oldest
STACK_EXTRAS := test,peft
SHOW_STACK := -c 'import importlib.metadata as m; print("stack:", ", ".join(p + " " + m.version(p) for p in ("torch", "transformers", "peft", "accelerate", "datasets", "huggingface-hub", "tokenizers", "numpy")))'

$(LATEST_VENV)/.created:
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	touch $@

test-latest: $(LATEST_VENV)/.created
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager "torch==$(LATEST_TORCH)" -e '.[$(STACK_EXTRAS)]'
	$(LATEST_VENV)/bin/python $(SHOW_STACK)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(LATEST_VENV)/bin/python -m pytest -m "not slow" -n 2 $(PYTEST_ARGS)

$(OLDEST_VENV)/.installed-stamp: pyproject.toml
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip uv
	$(OLDEST_VENV)/bin/uv pip compile pyproject.toml --extra test --extra peft --resolution lowest-direct \
		--python $(OLDEST_VENV)/bin/python --quiet --no-header -o $(OLDEST_VENV)/lowest.txt
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c $(OLDEST_VENV)/lowest.txt -e '.[$(STACK_EXTRAS)]'
	touch $@

test-oldest: $(OLDEST_VENV)/.installed-stamp
	$(OLDEST_VENV)/bin/python $(SHOW_STACK)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(OLDEST_VENV)/bin/python -m pytest -m "not slow" -n 2 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(OLDEST_VENV) .pytest_cache .hypothesis

# The main job: HateSpeech end to end (embeddings are cached under $HF_HOME/hf_defer, ~/.cache/huggingface/hf_defer by default); writes demo_model/.
# A quick form: make demo DEMO_ARGS="--max-rows 3000" (writes demo_model/ too, or demo_model_3000rows/ next to a fuller
# demo_model/, which is never replaced). Git ignores both.
DEMO_ARGS ?=
demo: install
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/demo.py $(DEMO_ARGS)

# The paper's HateSpeech Table 2 (4 surrogates x 5 seeds) and the three-expert run, written to results/.
# Committed results are kept unless REPRODUCE_ARGS=--overwrite. The ImageNet-16H half of Table 2 (results/imagenet16h.md)
# needs the data folder, which is not shipped: REPRODUCE_ARGS="--imagenet16h PATH" (see hf_defer.data.load_imagenet16h).
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

# GPT-4 or Mixtral per MMLU question on RouteLLM's shipped results: cross-fitted routers and RouteLLM's APGR / CPT
# (results/mmlu_routing.md). Embedding the 14,037 questions with MiniLM takes minutes on a CPU (cached afterwards).
MMLU_ROUTING_ARGS ?=
mmlu-routing: install
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/mmlu_routing.py $(MMLU_ROUTING_ARGS)

# Whom to defer to among ConvAbuse's 8 annotators, each of whom labelled a part of the items (results/convabuse.md):
# masked A-SM / S-SM / A-OvA against dropping rows, one pooled expert, the best annotator and the classifier alone.
# Embedding the ~4k turns and their contexts with MiniLM takes a few minutes on a CPU (cached afterwards).
# Committed results are kept unless CONVABUSE_ARGS=--overwrite.
CONVABUSE_ARGS ?=
convabuse: install
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/convabuse.py $(CONVABUSE_ARGS)

# Deferral budgets and error targets with a stated confidence (results/guarantees.md, .json, .png): how often the
# empirical rule and the guaranteed one break their promise over 1,000 calibration draws, on HateSpeech, ConvAbuse,
# MMLU routing and, given its folder (not shipped), ImageNet-16H: GUARANTEES_ARGS="--imagenet16h PATH". Embeddings and
# pools are cached; committed results are kept unless GUARANTEES_ARGS contains --overwrite.
GUARANTEES_ARGS ?=
guarantees: install
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) scripts/guarantees.py $(GUARANTEES_ARGS)

# Watching the promises on streams that shift at a known row (results/monitoring.md, .json, .png): hf_defer's monitor
# against a repeated window test, and its label-free error estimate against NannyML's CBPE, run in its own venv
# (NANNYML_VENV, created on first use: nannyml 0.13 pins what the training stack does not). ImageNet-16H needs its
# folder (not shipped): MONITORING_ARGS="--imagenet16h PATH"; committed results are kept unless it holds --overwrite.
# The follow-up section (the recalibrated estimate, starts every 50 rows, a horizon) on the same streams:
# MONITORING_FOLLOWUP_ARGS="--imagenet16h PATH".
NANNYML_VENV ?= .venv-nannyml
MONITORING_ARGS ?=
MONITORING_FOLLOWUP_ARGS ?=

$(NANNYML_VENV)/bin/python:
	$(PYTHON) -m venv $(NANNYML_VENV)
	$(NANNYML_VENV)/bin/python -m pip install --quiet nannyml==0.13.1 statsmodels==0.15.0

monitoring: install $(NANNYML_VENV)/bin/python
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) scripts/monitoring.py \
		--nannyml-python $(NANNYML_VENV)/bin/python $(MONITORING_ARGS)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) research/monitoring_followup.py \
		$(MONITORING_FOLLOWUP_ARGS)

# From deferral to reviewers and back (README): hf_defer.review with label-studio-sdk in .venv, the Label Studio server
# in its own venv (LS_VENV, created on first use: its pins differ from the training stack). The admin's API token comes
# from $LABEL_STUDIO_API_KEY only (`make review-server` needs it set; the tests and the demo make a random one).
LS_VENV ?= .venv-label-studio
REVIEW_STAMP := $(VENV)/.review-installed-stamp
REVIEW_SERVER_ARGS ?=
REVIEW_DEMO_ARGS ?=

$(REVIEW_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,review,review-test]'
	touch $@

$(LS_VENV)/bin/label-studio:
	$(PY) -c 'from hf_defer.review.server import ensure_label_studio; ensure_label_studio("$(LS_VENV)")'

# A local server on 127.0.0.1:8080 (REVIEW_SERVER_ARGS="--port 8081 --data_dir ls-data" to change) until Ctrl-C.
review-server: $(REVIEW_STAMP) $(LS_VENV)/bin/label-studio
	$(PY) -m hf_defer.review.server --venv $(LS_VENV) $(REVIEW_SERVER_ARGS)

# A few rounds of the loop on HateSpeech against a server it starts: results/review_loop.md and .png.
review-demo: $(REVIEW_STAMP) $(LS_VENV)/bin/label-studio
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(PY) scripts/review_demo.py $(REVIEW_DEMO_ARGS)

# tests/review/ with the live tests: a Label Studio server, PostgreSQL when installed, and headless Chromium
# (Debian's chromium and chromium-driver, installed here when missing and run as root).
test-review: $(REVIEW_STAMP) $(LS_VENV)/bin/label-studio
	command -v chromedriver >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest tests/review -m "not slow or review or browser" $(PYTEST_ARGS)

# The documentation site (mkdocs.yml): the guides of docs/, the API reference from the docstrings, the command-line
# reference from the parsers. --strict: a broken link, a missing reference or a docstring that does not render fails.
# Offline: nothing is fetched. `make docs-serve` serves it on http://127.0.0.1:8000 (DOCS_SERVE_ARGS="-a 0.0.0.0:8001").
DOCS_SERVE_ARGS ?=
DOCS_ENV := HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 NO_MKDOCS_2_WARNING=1
docs: install
	$(DOCS_ENV) $(PY) -m mkdocs build --strict --site-dir site

docs-serve: install
	$(DOCS_ENV) $(PY) -m mkdocs serve --strict $(DOCS_SERVE_ARGS)

# tests/docs with the browser test: the built site served on 127.0.0.1, searched in headless Chromium (Debian's
# chromium and chromium-driver, installed here when missing and run as root, as for test-review).
test-docs: $(REVIEW_STAMP)
	command -v chromedriver >/dev/null || { test "$$(id -u)" = 0 && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 $(PY) -m pytest tests/docs -m "not slow or browser" $(PYTEST_ARGS)
