# Two commands on a fresh clone: `make quickstart` (train, translate, score) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN := runs/quickstart
PIP := $(BIN)/pip install -q --disable-pip-version-check

.PHONY: quickstart test test-comet venv lint docs install-check clean

venv: $(VENV)/.installed

# torch==2.13.0 first: it is the CPU wheel on this machine's disk; any looser request pulls a CUDA build.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	touch $@

# nmt-train refuses a run dir that holds checkpoints (resume= continues one), so a second quickstart starts afresh.
quickstart: venv
	rm -rf $(RUN)
	$(BIN)/nmt-train experiment=quickstart run_dir=$(RUN)
	$(BIN)/nmt-translate checkpoint=$(RUN) input=data/toy/test.src output=$(RUN)/test.hyp
	$(BIN)/nmt-evaluate hyp=$(RUN)/test.hyp ref=data/toy/test.tgt

# One worker per core (pytest-xdist), one torch thread each (tests/conftest.py); tests handed out the longest files
# first, an idle worker taking tests from the other's queue (worksteal: 5 min 27 s on 2 cores, against 5 min 54 s
# with whole files per worker); `$(BIN)/python -m pytest -q tests` runs it in one process.
test: venv
	$(BIN)/python -m pytest -q -n auto --dist worksteal tests

# COMET's tests in an environment of their own (.venv-comet: unbabel-comet pins transformers<5, which the hf extra's
# transformers 5 cannot share), where its model tests must run (NMT_REQUIRE_COMET=1), not skip.
COMET_VENV := .venv-comet
test-comet:
	test -x $(COMET_VENV)/bin/python || $(PYTHON) -m venv $(COMET_VENV)
	$(COMET_VENV)/bin/pip install -q --disable-pip-version-check torch==2.13.0
	$(COMET_VENV)/bin/pip install -q --disable-pip-version-check -e '.[comet]' 'pytest>=7' 'hypothesis>=6'
	NMT_REQUIRE_COMET=1 $(COMET_VENV)/bin/python -m pytest -q -rs tests/test_comet.py

# ruff (configured in pyproject.toml): lint and formatting.
lint: venv
	$(BIN)/ruff check nmt tests scripts
	$(BIN)/ruff format --check nmt tests scripts

# The manual (MkDocs, docs/), built as CI builds it.
docs: venv
	$(BIN)/mkdocs build --strict -d build/site

# The wheel, installed non-editable into a fresh virtual environment and run from an empty folder outside the checkout.
install-check: venv
	bash scripts/install_check.sh $(PYTHON)

clean:
	rm -rf $(VENV) runs outputs data/toy data/cache build dist
