# Two commands do all the set-up on a fresh machine:
#   make run    creates .venv, installs multihead, and runs `multihead explain` on its embedded default
#   make test   creates .venv, installs multihead with its test and model extras, and runs the test suite
# Both build the C++ decode kernel for this CPU once (multihead.backends.cpu.build.build_now), so no test pays for it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench clean

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

bench: $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[cli]"
	$(BIN)/multihead bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
