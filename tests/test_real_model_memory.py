"""A real model at the default preset's batch shape stays inside the actor's memory estimate (runners/reasoning/memory.py).

One actor rank's training step on SmolLM2-135M-Instruct, at the main preset with only model.path changed (its
rows of a 32 x 8 batch, a chat prompt plus 28 new tokens, precision auto), in a process of its own whose peak RSS is
measured. The step runs two of the micro-batches the estimate sizes (the peak is per micro-batch; a whole step's
128 rows would only repeat them). Before the chunked output layer and the memory-sized micro-batches, the same
step ran 64-row micro-batches over full-vocabulary fp32 logits and peaked over 10 GB per rank (9.5 GB in bf16)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REAL_MODEL

ROOT = Path(__file__).resolve().parent.parent
PROMPT_TOKENS = 40  # the arithmetic task's chat prompt, measured with SmolLM2's template: 33-41 tokens

STEP = textwrap.dedent("""
    import json, os, sys, tempfile
    import torch, torch.distributed as dist
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from transformers import AutoModelForCausalLM
    from rlinf_like.config import hydra_schema, structure
    from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
    from rlinf_like.hybrid_engines.model_manager import OptimConfig
    from rlinf_like.runners.reasoning import memory
    from rlinf_like.runners.reasoning.actor_setup import actor_precision
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runners.reasoning.worker_configs import loop_terms, loss_terms
    from rlinf_like.training.loop import micro_rows, train_epochs
    from rlinf_like.workers.actor.loss import rl_loss

    model_path, prompt_tokens = sys.argv[1], int(sys.argv[2])
    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    with initialize_config_dir(config_dir=os.path.abspath("examples/reasoning/config"), version_base="1.3"):
        raw = compose("grpo_collocated", overrides=[f"model.path={model_path}"])
    cfg = structure(ReasoningConfig, raw)
    ranks = 2  # the preset's actor: "0-1"
    estimate = memory.actor_memory(cfg, ranks)
    terms = loop_terms(cfg, estimate.tokens)
    rows_per_rank = cfg.runner.prompts_per_step * cfg.algorithm.samples_per_prompt // ranks
    length = prompt_tokens + cfg.runner.max_new_tokens
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    manager = FSDPModelManager(model, FSDPConfig(optim=OptimConfig(lr=cfg.algorithm.lr),
                                                 precision=actor_precision(cfg)))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows_per_rank, length), generator=g)
    response = torch.zeros(rows_per_rank, length - 1)
    response[:, prompt_tokens - 1:] = 1
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response,
                 old_logprobs=torch.full((rows_per_rank, length - 1), -2.0),
                 advantages=torch.randn(rows_per_rank, length - 1, generator=g) * response)
    rows = micro_rows(batch, cfg.actor.loop, terms.micro_batch_tokens) or rows_per_rank
    two = {k: v[: 2 * rows] for k, v in batch.items()}
    metrics = train_epochs(manager, two, rl_loss(cfg.actor.loss, loss_terms(cfg)), 0, 1, cfg.actor.loop,
                           terms=terms)
    status = {l.split(":")[0]: l.split()[1] for l in open("/proc/self/status") if l.startswith(("Rss", "VmHWM"))}
    # this process's own high-water mark: getrusage's ru_maxrss survives execve, so it can report the forking
    # parent's size (pytest's, several GB late in the suite) instead of the step's
    peak = int(status["VmHWM"]) * 1024
    # this one rank holds the whole optimizer state, which 2 ranks would split: the estimate for 1 rank
    whole = memory.actor_memory(cfg, 1)
    print(json.dumps(dict(peak=peak, rows=rows, length=length, precision=manager.precision,
                          estimate=whole.static + rows * length * whole.per_token, budget=estimate.budget,
                          finite=all(v == v for v in metrics.values()), status=status)))
""")


@pytest.mark.real_model
@pytest.mark.timeout(300)
def test_one_actor_rank_at_the_default_preset_stays_inside_its_memory_estimate():
    proc = subprocess.run([sys.executable, "-c", STEP, str(REAL_MODEL), str(PROMPT_TOKENS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=280,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["finite"] and 1 <= got["rows"] <= 64
    # 3.2 GB measured alone (VmHWM); 64-row micro-batches over full logits peaked at 9.5 GB (bf16;
    # 10.5 GB per rank in fp32 before this change).
    assert got["peak"] <= 1.3 * got["estimate"], got
    assert got["peak"] <= 7e9, got


def test_a_plan_whose_actor_cannot_fit_is_refused_before_any_worker_starts(tmp_path):
    from small_runs import small_reasoning_config

    from rlinf_like.runners.preflight import preflight

    cfg = small_reasoning_config(tmp_path)
    cfg.actor.loop.micro_batch_size = None
    preflight(cfg)  # fits at the default share of this machine
    cfg.actor.memory_gb = 1.0  # under what the tiny model's rank holds whatever the batch (runtime and head chunks)
    with pytest.raises(ValueError, match=r"^actor: a micro-batch of 1 row\(s\) of up to 9 tokens needs ~1\.\d GB "
                                         r"per rank, over its 1\.0 GB .*actor\.memory_gb, actor\.loop\.micro_batch_size"):
        preflight(cfg)


def test_a_model_the_default_share_cannot_hold_gets_the_floor_and_a_lean_actor(tmp_path, monkeypatch):
    """actor.memory_gb unset: on a machine whose 30% cannot hold the model (Gemma 3 270M here: 4.6 GB a rank against
    3.8), the budget rises to what RAISED_TOKENS tokens need and the actor trades speed for memory; a budget the user
    sets is theirs (refused when too small, as above)."""
    from small_runs import small_reasoning_config

    from rlinf_like.runners.reasoning import memory

    cfg = small_reasoning_config(tmp_path)
    roomy = memory.actor_memory(cfg, 2)
    assert not roomy.raised and "raised" not in roomy.describe()
    monkeypatch.setattr(memory, "machine_bytes", lambda: 2 * roomy.static / memory.DEFAULT_SHARE * 0.9)
    tight = memory.actor_memory(cfg, 2)
    assert tight.raised and tight.tokens in (memory.RAISED_TOKENS - 1, memory.RAISED_TOKENS)  # float division
    assert f"cannot hold this model: raised to what {memory.RAISED_TOKENS} tokens need" in tight.describe()
    cfg.actor.memory_gb = 1.0
    assert not memory.actor_memory(cfg, 2).raised


def test_memory_sized_micro_batches_hold_the_budget_s_tokens_at_the_batch_s_length():
    import torch

    from rlinf_like.training.loop import AUTO_ROWS_CAP, LoopConfig, micro_rows

    batch = {"input_ids": torch.zeros(200, 68, dtype=torch.long)}
    assert micro_rows(batch, LoopConfig(micro_batch_size=None), 432) == 6  # 432 // 68
    assert micro_rows(batch, LoopConfig(micro_batch_size=None), 50) == 1  # never 0 rows
    assert micro_rows(batch, LoopConfig(micro_batch_size=None), 10**9) == AUTO_ROWS_CAP
    assert micro_rows(batch, LoopConfig(micro_batch_size=8), 432) == 8  # explicit rows win
    assert micro_rows(batch, LoopConfig(micro_batch_size=None)) is None  # neither: one pass


@pytest.mark.real_model
def test_the_native_kv_cache_is_sized_for_the_run_s_samples_not_the_model_s_context():
    from rlinf_like.runners.reasoning import memory
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    cfg = ReasoningConfig()
    cfg.model.path, cfg.runner.prompts_per_step = str(REAL_MODEL), 32  # the default preset's 32 x 8 samples
    per_token = 2 * 30 * 3 * 64 * 4  # SmolLM2: 30 layers, 3 KV heads of 64, fp32 keys and values
    assert memory.kv_bytes_per_token(cfg, 4) == per_token
    # 128 slots per replica (256 samples over 2, at most rollout.max_batch_size) x (40 + 28 tokens), +25%
    assert memory.rollout_kv_gb(cfg, 2, 40) == pytest.approx(1.25 * 128 * 68 * per_token / 2**30)
    # never below what the engine needs for one sequence of the model's 8192-token context
    cfg.runner.prompts_per_step = 1
    assert memory.rollout_kv_gb(cfg, 2, 40) == pytest.approx((8192 // 16 + 2) * 16 * per_token / 2**30)
