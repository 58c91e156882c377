# Two commands do all the set-up on a fresh machine:
#   make run    creates .venv, installs multihead, and runs `multihead explain` on its embedded default
#   make test   creates .venv, installs multihead with its test and model extras, and runs the test suite
# Both build the C++ decode kernel for this CPU once (multihead.backends.cpu.build.build_now), so no test pays for it.
# The versions `make test` installs are pinned in constraints.txt. To check the newest releases separately:
#   make test-latest   creates .venv-latest, installs the newest transformers (and the rest of the models
#                      extra; torch stays at its pin), runs the `models` tests and records the result in
#                      docs/releases.json (docs/releases.md). PYTEST_ARGS narrows the run (e.g. to some files).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LATEST := .venv-latest
LATEST_BIN := $(LATEST)/bin

.PHONY: run test test-latest bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

run: $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[cli]"
	$(BIN)/python -c "from multihead.backends.cpu.build import build_now; print(build_now())"
	$(BIN)/multihead explain

test: $(BIN)/python
	bash scripts/install-test-deps.sh $(BIN)/python
	$(BIN)/python -c "from multihead.backends.cpu.build import build_now; print(build_now())"
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

$(LATEST_BIN)/python:
	$(PY) -m venv $(LATEST)
	$(LATEST_BIN)/python -m pip install -q --upgrade pip

test-latest: $(LATEST_BIN)/python
	grep '^torch==' constraints.txt > $(LATEST)/constraints.txt
	CONSTRAINTS=$(LATEST)/constraints.txt UPGRADE=1 BROWSER=0 bash scripts/install-test-deps.sh $(LATEST_BIN)/python
	$(LATEST_BIN)/python -c "from multihead.backends.cpu.build import build_now; print(build_now())"
	$(LATEST_BIN)/python -m pytest -q -ra -m models --junitxml=$(LATEST)/results.xml $(PYTEST_ARGS); status=$$?; \
	$(LATEST_BIN)/python scripts/record_latest.py $(LATEST)/results.xml docs/releases.json \
		"make test-latest$(if $(PYTEST_ARGS), PYTEST_ARGS='$(PYTEST_ARGS)')" && exit $$status

bench: $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[cli]"
	$(BIN)/multihead bench

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache .hypothesis
