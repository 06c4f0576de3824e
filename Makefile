# Two commands on a fresh clone: `make quickstart` (train, translate, score) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUN := runs/quickstart

.PHONY: quickstart test venv clean

venv: $(VENV)/.installed

# torch==2.13.0 first: it is the CPU wheel on this machine's disk; any looser request pulls a CUDA build.
$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

# nmt-train refuses a run dir that holds checkpoints (resume= continues one), so a second quickstart starts afresh.
quickstart: venv
	rm -rf $(RUN)
	$(BIN)/nmt-train experiment=quickstart run_dir=$(RUN)
	$(BIN)/nmt-translate checkpoint=$(RUN) input=data/toy/test.src output=$(RUN)/test.hyp
	$(BIN)/nmt-evaluate hyp=$(RUN)/test.hyp ref=data/toy/test.tgt

test: venv
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) runs outputs data/toy data/cache
