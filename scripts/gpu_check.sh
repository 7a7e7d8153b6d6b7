#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, then the main job placed on GPU 0 (actor and rollout
# collocated on it). Run it on a CUDA machine with the package's dependencies importable:
#     bash scripts/gpu_check.sh            # logs and the run's table under gpu_check_out/
# Environment: PYTHON (default python3), OUT (where logs go), GPU_CHECK_STEPS (main-job steps, default the
# preset's 150), GPU_CHECK_ONLY: a comma list of tests, main, variants (LoRA, Megatron, PPO, KL; 20 steps
# each). Nothing is skipped silently: pytest's -rs lists every skip with its reason (SGLang without [sglang]).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
parts=${GPU_CHECK_ONLY:-tests,main,variants}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, ray; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'gpus', torch.cuda.device_count(), '| transformers', transformers.__version__, '| ray', ray.__version__)"

if [[ $parts == *tests* ]]; then
  # Only the files that hold gpu-marked tests: collecting the whole suite would import every extra (MuJoCo, TRL).
  mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/*.py)
  "$PY" -m pytest "${gpu_files[@]}" -m gpu -v -rs -p no:cacheprovider --timeout 300 --junitxml "$OUT/gpu_tests.xml" 2>&1 |
    tee "$OUT/gpu_tests.log"
  status=$((status | ${PIPESTATUS[0]}))
fi

# One GRPO run of the main job with every component on GPU 0 (the preset's placement names CPU slots "0-1"; on
# a GPU machine the default device kind is gpu). $1: log name, then overrides.
main_job() {
  local name=$1; shift
  local run_dir; run_dir=$(mktemp -d)/$name
  timeout 420 "$PY" examples/reasoning/main_grpo.py cluster.num_cpus=8 cluster.num_gpus=1 \
    cluster.component_placement.actor=0 cluster.component_placement.rollout=0 \
    cluster.component_placement.critic=0 "runner.output_dir=$run_dir" "$@" 2>&1 | tee "$OUT/$name.log"
  status=$((status | ${PIPESTATUS[0]}))
  cp "$run_dir/curves.png" "$OUT/$name.png" 2>/dev/null || true
}

[[ $parts == *main* ]] && main_job main_job "runner.max_steps=${GPU_CHECK_STEPS:-150}"
if [[ $parts == *variants* ]]; then  # the other actor paths, short
  main_job lora runner.max_steps=20 actor.lora.rank=8 actor.lora.alpha=16
  main_job megatron runner.max_steps=20 actor.backend=megatron
  main_job ppo runner.max_steps=20 algorithm.advantage=gae
  main_job kl runner.max_steps=20 algorithm.kl_beta=0.01
fi
exit $status
