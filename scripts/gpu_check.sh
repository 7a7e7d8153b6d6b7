#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, then the main job placed on GPU 0 (actor and rollout
# collocated on it). Run it on a CUDA machine with the package's dependencies importable:
#     bash scripts/gpu_check.sh            # logs and the run's table under gpu_check_out/
# Environment: PYTHON (default python3), OUT (where logs go), GPU_CHECK_STEPS (main-job steps, default 30),
# GPU_CHECK_ONLY=tests|main (one part only). Nothing here is skipped silently: pytest's -rs lists every
# skip with its reason (SGLang without the [sglang] extra, say).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, ray; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'gpus', torch.cuda.device_count(), '| transformers', transformers.__version__, '| ray', ray.__version__)"

if [[ ${GPU_CHECK_ONLY:-tests} != main ]]; then
  # Only the files that hold gpu-marked tests: collecting the whole suite would import every extra (MuJoCo, TRL).
  mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/*.py)
  "$PY" -m pytest "${gpu_files[@]}" -m gpu -v -rs -p no:cacheprovider --timeout 300 --junitxml "$OUT/gpu_tests.xml" 2>&1 |
    tee "$OUT/gpu_tests.log"
  status=$((status | ${PIPESTATUS[0]}))
fi

if [[ ${GPU_CHECK_ONLY:-main} != tests ]]; then
  run_dir=$(mktemp -d)/grpo_gpu
  # The preset's placement names CPU slots "0-1"; on a GPU machine the default device kind is gpu, so "0"
  # puts every component on GPU 0.
  timeout 420 "$PY" examples/reasoning/main_grpo.py cluster.num_cpus=8 cluster.num_gpus=1 \
    cluster.component_placement.actor=0 cluster.component_placement.rollout=0 \
    cluster.component_placement.critic=0 "runner.max_steps=${GPU_CHECK_STEPS:-30}" \
    "runner.output_dir=$run_dir" 2>&1 | tee "$OUT/main_job.log"
  status=$((status | ${PIPESTATUS[0]}))
  cp "$run_dir"/*.png "$run_dir"/*.md "$OUT/" 2>/dev/null || true
fi
exit $status
