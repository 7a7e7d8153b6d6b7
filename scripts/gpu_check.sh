#!/usr/bin/env bash
# The GPU checks: every test marked `gpu`, then short runs placed on GPU 0 (actor and rollout collocated on it),
# and a table of what passed. Run it on a CUDA machine:
#     bash scripts/gpu_check.sh            # logs, curves and the table under gpu_check_out/
# A machine with no package index: put wheels (*.whl) and unpacked site-packages tarballs (*.tar.xz) of what it
# lacks in GPU_CHECK_WHEELS (default .whl/); they are installed into a scratch folder only when an import fails,
# and the script names each package still missing. scripts/gpu_wheels.sh fills .whl/ for a cp312 machine, Ray included.
# Environment: PYTHON (default python3), OUT (where logs go), GPU_CHECK_STEPS (main-job steps, default the
# preset's 150), GPU_CHECK_ONLY: a comma list of parts: tests, main, local (the main job in one process,
# cluster.backend=local, 40 steps), variants (LoRA, Megatron, PPO, KL; 20 steps each), agent (the calculator preset), async (runner.schedule=async), bench (bench/rollout.py on the GPU),
# rollout34 (bench/rollout.py --cuda-graphs on random-weight SmolLM2 and Qwen2.5-0.5B shapes), real
# (SmolLM2-135M when models/smollm2-135m-instruct exists). Nothing is skipped silently: pytest's -rs lists every
# skip with its reason (SGLang without [sglang]).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu_check_out}
WHEELS=${GPU_CHECK_WHEELS:-.whl}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
parts=${GPU_CHECK_ONLY:-tests,main,local,variants,agent,async,bench,rollout34,real}
status=0
summary=()

# import name -> what provides it (the package's dependencies are ours; extras only where a part needs them)
NEEDED="ray hydra omegaconf transformers safetensors datasets math_verify peft tensorboard matplotlib tqdm
  megatron.core fastapi uvicorn openai bm25s pydantic"
missing() { "$PY" - "$@" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m.split(".")[0]) is None
                or (("." in m) and importlib.util.find_spec(m) is None)))
EOF
}
lacking=$(missing $NEEDED)
if [[ -n $lacking && -d $WHEELS ]]; then
  echo "gpu_check: missing [$lacking]; installing what $WHEELS/ carries"
  site=${GPU_CHECK_SITE:-/tmp/gpu_check_site}
  mkdir -p "$site"
  for t in "$WHEELS"/*.tar.xz; do [[ -e $t ]] && tar xJf "$t" -C "$site"; done
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl ||
      echo "gpu_check: pip could not install the wheels in $WHEELS" >&2
  fi
  export PYTHONPATH="$PYTHONPATH:$site"
  lacking=$(missing $NEEDED)
fi
[[ -n $lacking ]] && echo "gpu_check: still missing [$lacking]: the parts that need them fail or skip, naming them"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers, ray; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'gpus', torch.cuda.device_count(), '| transformers', transformers.__version__, '| ray', ray.__version__)"

# record NAME SECONDS STATUS
record() { summary+=("$(printf '| %-28s | %6ss | %s |' "$1" "$2" "$([[ $3 == 0 ]] && echo passed || echo "FAILED ($3)")")"); }

if [[ $parts == *tests* ]]; then
  # Only the files that hold gpu-marked tests: collecting the whole suite would import every extra (MuJoCo, TRL).
  mapfile -t gpu_files < <(grep -l "pytest.mark.gpu" tests/*.py)
  start=$SECONDS
  "$PY" -m pytest "${gpu_files[@]}" -m gpu -v -rs -p no:cacheprovider --timeout 300 --junitxml "$OUT/gpu_tests.xml" 2>&1 |
    tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}; status=$((status | rc)); record "gpu-marked tests" $((SECONDS - start)) "$rc"
fi

# One run of an example with every component on GPU 0 (the presets' placements name CPU slots "0-1"; on a GPU
# machine the default device kind is gpu). $1: log name, $2: the example script, then overrides.
gpu_run() {
  local name=$1 script=$2; shift 2
  local run_dir; run_dir=$(mktemp -d)/$name
  local start=$SECONDS
  timeout 420 "$PY" "$script" cluster.num_cpus=8 cluster.num_gpus=1 \
    cluster.component_placement.actor=0 cluster.component_placement.rollout=0 \
    cluster.component_placement.critic=0 cluster.component_placement.teacher=0 cluster.component_placement.judge=0 \
    "runner.output_dir=$run_dir" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}; status=$((status | rc)); record "$name" $((SECONDS - start)) "$rc"
  cp "$run_dir/curves.png" "$OUT/$name.png" 2>/dev/null || true
}
GRPO=examples/reasoning/main_grpo.py

[[ $parts == *main* ]] && gpu_run main_job $GRPO "runner.max_steps=${GPU_CHECK_STEPS:-150}"
# the in-process backend shares one process between actor and rollout, so its weight sync takes the CUDA IPC
# path's same-process branch, which no other part runs
[[ $parts == *local* ]] && gpu_run main_local $GRPO runner.max_steps=40 cluster.backend=local
if [[ $parts == *variants* ]]; then  # the other actor paths, short
  gpu_run lora $GRPO runner.max_steps=20 actor.lora.rank=8 actor.lora.alpha=16
  gpu_run megatron $GRPO runner.max_steps=20 actor.backend=megatron
  gpu_run ppo $GRPO runner.max_steps=20 algorithm.advantage=gae
  gpu_run kl $GRPO runner.max_steps=20 algorithm.kl_beta=0.01
fi
[[ $parts == *agent* ]] && gpu_run agent_calculator examples/agentic/main_agent.py runner.max_steps=20
[[ $parts == *async* ]] && gpu_run async $GRPO runner.max_steps=40 runner.schedule=async
if [[ $parts == *bench* ]]; then
  start=$SECONDS
  "$PY" bench/rollout.py --device cuda --dtype bfloat16 --prompts 64 --new-tokens 128 2>&1 | tee "$OUT/bench_rollout.log"
  rc=${PIPESTATUS[0]}; status=$((status | rc)); record "bench/rollout.py tiny" $((SECONDS - start)) "$rc"
fi
if [[ $parts == *rollout34* ]]; then
  # the native engine with CUDA graphs against transformers generate, bf16, random weights of two real
  # shapes built from config.json alone, 64 prompts x 4 samples x 512 new tokens, EOS ignored, decode-step times
  for shape in smollm2-135m qwen2.5-0.5b; do
    start=$SECONDS
    "$PY" bench/rollout.py --device cuda --dtype bfloat16 --cuda-graphs --from-config bench/configs/$shape.json \
      --prompts 64 --samples 4 --new-tokens 512 --hf-mode eager --step-batches 1,32,128,256 2>&1 |
      tee "$OUT/bench_rollout34_$shape.log"
    rc=${PIPESTATUS[0]}; status=$((status | rc)); record "bench/rollout.py $shape graphs" $((SECONDS - start)) "$rc"
  done
fi
MODEL=models/smollm2-135m-instruct
if [[ $parts == *real* ]]; then
  if [[ -f $MODEL/config.json ]]; then
    start=$SECONDS
    "$PY" bench/rollout.py --device cuda --dtype bfloat16 --model $MODEL --prompts 64 --new-tokens 128 2>&1 |
      tee "$OUT/bench_rollout_smollm2.log"
    rc=${PIPESTATUS[0]}; status=$((status | rc)); record "bench/rollout.py SmolLM2" $((SECONDS - start)) "$rc"
    # the main job's generated sums instead of grpo_smollm2's reasoning-gym (a dozen more packages to carry)
    gpu_run smollm2_grpo $GRPO model.path=$MODEL actor.lora.rank=16 actor.lora.alpha=32 \
      runner.max_steps=30 runner.eval_every=10
  else
    echo "gpu_check: no $MODEL (python -m rlinf_like.models.get smollm2-135m-instruct models/): real-model part skipped"
  fi
fi

echo; echo "| part | time | result |"; echo "|---|---|---|"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.md"
exit $status
