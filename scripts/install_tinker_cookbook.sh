#!/usr/bin/env bash
# tinker-cookbook's recipes against the Tinker-compatible server (docs/guides/tinker.md). tinker-cookbook 0.6.1
# declares tml-renderers>=0.4.1, which the package index this project installs from lacks (it has 0.2.1): both go in
# with --no-deps, and the cookbook's other requirements missing from scripts/setup.sh's environment normally.
# With 0.2.1 the cookbook's own renderers (role_colon, qwen3_instruct, llama3, ...) work; what needs a newer
# tml-renderers fails at its import. scripts/setup.sh runs it (tests/test_tinker_cookbook.py runs math_rl).
#     bash scripts/install_tinker_cookbook.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt "chz>=0.4.0" "blobfile>=3.0.0" \
    "pyrage>=1.4.0" pylatexenc
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps "tinker-cookbook==0.6.1" "tml-renderers==0.2.1"
"$PY" -c "import tinker_cookbook.recipes.math_rl.train, tinker_cookbook.recipes.chat_sl.train
print('tinker-cookbook ready')"
