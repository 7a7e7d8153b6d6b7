"""Off-policy corrections, the decoupled PPO loss and the mismatch diagnostics against values worked out by
hand (in the comments), their config keys and checks, and the pipelined preset running decoupled PPO + MIS.

Ratios are powers of two (log ratios ln 2^k), so every weight below is exact in float32."""

import math
from functools import partial

import pytest
import torch

from rlinf_like.algorithms import PolicyLossConfig, policy_loss
from rlinf_like.algorithms.offpolicy import (
    IS_CORRECTIONS,
    POLICY_LOSSES,
    ISThresholds,
    apply_correction,
    mismatch_metrics,
    policy_terms,
)
from rlinf_like.config import ConfigError, check_overrides
from rlinf_like.runners.reasoning.checks import check_off_policy
from rlinf_like.runners.reasoning.config import AlgorithmConfig, ReasoningConfig
from rlinf_like.workers.actor.loss import LossConfig

LN2 = math.log(2.0)
# two responses of 4 tokens; row 1's last token is padding. ratio = proximal / behaviour:
#   row 0: 1, 4, 1/4, 2      row 1: 1/2, 1/2, 1, (pad: 8)
RATIOS = torch.tensor([[1.0, 4.0, 0.25, 2.0], [0.5, 0.5, 1.0, 8.0]])
MASK = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])
BEHAVIOUR = torch.full((2, 4), -2.0)
PROXIMAL = BEHAVIOUR + torch.log(RATIOS)
T = ISThresholds(cap=2.0, low=0.5, high=2.0)


def correct(name, thresholds=T):
    return apply_correction(name, PROXIMAL - BEHAVIOUR, MASK, thresholds)


def exact(a, b):
    assert torch.equal(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)), (a, b)


def test_none_is_the_plain_ratio():
    c = correct("none")
    exact(c.weights, [[1, 4, 0.25, 2], [0.5, 0.5, 1, 0]])  # padding weighs 0
    exact(c.mask, MASK)


def test_tis_truncates_at_the_cap_and_keeps_every_token():
    c = correct("tis")
    exact(c.weights, [[1, 2, 0.25, 2], [0.5, 0.5, 1, 0]])  # 4 -> 2; 1/4 stays (truncation is one-sided)
    exact(c.mask, MASK)


def test_mis_drops_tokens_outside_the_range():
    c = correct("mis")  # [0.5, 2]: 4 and 1/4 are out; 0.5 and 2 are on the bounds, kept
    exact(c.mask, [[1, 0, 0, 1], [1, 1, 1, 0]])
    exact(c.weights, [[1, 0, 0, 2], [0.5, 0.5, 1, 0]])


def test_icepop_zeroes_tokens_outside_the_range_but_keeps_them_in_the_count():
    c = correct("icepop")
    exact(c.weights, [[1, 0, 0, 2], [0.5, 0.5, 1, 0]])
    exact(c.mask, MASK)  # unlike mis: the average still divides by all 7 tokens


def test_seq_mask_drops_whole_responses_by_their_geometric_mean():
    # row 0: log geo-mean = (0 + 2 - 2 + 1) ln2 / 4 = ln2 / 4 -> 2^0.25 = 1.19: kept
    # row 1: (-1 - 1 + 0) ln2 / 3 -> 2^(-2/3) = 0.63: kept in [0.5, 2], dropped in [0.7, 2]
    c = correct("seq_mask")
    exact(c.mask, MASK)
    exact(c.weights, [[1, 4, 0.25, 2], [0.5, 0.5, 1, 0]])  # kept tokens weigh their own ratio
    c = correct("seq_mask", ISThresholds(low=0.7, high=2.0))
    exact(c.mask, [[1, 1, 1, 1], [0, 0, 0, 0]])
    exact(c.weights, [[1, 4, 0.25, 2], [0, 0, 0, 0]])


def test_every_registered_correction_is_tested_here():
    assert sorted(IS_CORRECTIONS.names()) == ["icepop", "mis", "none", "seq_mask", "tis"]
    assert sorted(POLICY_LOSSES.names()) == ["decoupled_ppo", "ppo"]


def test_weights_carry_no_gradient():
    proximal = PROXIMAL.clone().requires_grad_(True)
    for name in IS_CORRECTIONS.names():
        c = apply_correction(name, proximal - BEHAVIOUR, MASK, T)
        assert not c.weights.requires_grad, name


def test_policy_terms_by_loss_and_correction():
    kw = dict(behaviour=BEHAVIOUR, proximal=PROXIMAL, mask=MASK)
    ppo = policy_terms("ppo", "none", T, **kw)  # today's PPO on recomputed logprobs: no weights
    assert ppo.weights is None and torch.equal(ppo.old_logprobs, PROXIMAL) and torch.equal(ppo.mask, MASK)
    plain = policy_terms("ppo", "none", T, behaviour=BEHAVIOUR, proximal=None, mask=MASK)
    assert plain.weights is None and torch.equal(plain.old_logprobs, BEHAVIOUR)
    exact(policy_terms("ppo", "tis", T, **kw).weights, correct("tis").weights)  # the old is_correction_cap
    decoupled = policy_terms("decoupled_ppo", "none", T, **kw)  # AReaL without a cap: the raw ratio
    exact(decoupled.weights, correct("none").weights)
    mis = policy_terms("decoupled_ppo", "mis", T, **kw)
    exact(mis.weights, correct("mis").weights)
    exact(mis.mask, correct("mis").mask)


def test_decoupled_ppo_loss_by_hand():
    # current = proximal * (1.5 on token 0, 1 elsewhere), advantages 1: token 0's current/proximal ratio 1.5 is
    # clipped to 1.2, the others are 1. Per-token loss -A * clip(r) * w with w the mis weights:
    #   row 0: -1.2*1, -1*0, -1*0, -1*2     row 1: -0.5, -0.5, -1, (pad)
    # token-mean over mis's 5 kept tokens: -(1.2 + 2 + 0.5 + 0.5 + 1) / 5 = -1.04
    current = PROXIMAL.clone()
    current[0, 0] += math.log(1.5)
    terms = policy_terms("decoupled_ppo", "mis", T, behaviour=BEHAVIOUR, proximal=PROXIMAL, mask=MASK)
    loss, metrics = policy_loss(current, terms.old_logprobs, torch.ones(2, 4), terms.mask, PolicyLossConfig(),
                                terms.weights)
    assert math.isclose(float(loss), -1.04, rel_tol=1e-6)
    assert math.isclose(metrics["clip_fraction"], 1 / 5, rel_tol=1e-6)
    # icepop: the same weights, but divided by all 7 tokens: -5.2 / 7
    terms = policy_terms("decoupled_ppo", "icepop", T, behaviour=BEHAVIOUR, proximal=PROXIMAL, mask=MASK)
    loss, _ = policy_loss(current, terms.old_logprobs, torch.ones(2, 4), terms.mask, PolicyLossConfig(), terms.weights)
    assert math.isclose(float(loss), -5.2 / 7, rel_tol=1e-6)


def test_mismatch_metrics_by_hand():
    # the 7 valid ratios: 1, 4, 1/4, 2, 1/2, 1/2, 1; log ratios in units of ln2: 0, 2, -2, 1, -1, -1, 0
    m = mismatch_metrics(PROXIMAL, BEHAVIOUR, MASK, correct("mis"))
    assert math.isclose(m["mismatch/abs_log_ratio_mean"], 7 * LN2 / 7, rel_tol=1e-6)
    assert math.isclose(m["mismatch/abs_log_ratio_max"], 2 * LN2, rel_tol=1e-6)
    # k3 = r - ln r - 1 per token, averaged
    k3 = sum(r - math.log(r) - 1 for r in (1, 4, 0.25, 2, 0.5, 0.5, 1)) / 7
    assert math.isclose(m["mismatch/kl_k3"], k3, rel_tol=1e-6)
    # sorted ratios 1/4, 1/2, 1/2, 1, 1, 2, 4: the median is 1; p1 = 1/4 + 0.06 * (1/2 - 1/4) (linear
    # interpolation at position 0.06), p99 = 2 + 0.94 * (4 - 2)
    assert math.isclose(m["mismatch/ratio_p50"], 1.0, rel_tol=1e-6)
    assert math.isclose(m["mismatch/ratio_p1"], 0.265, rel_tol=1e-6)
    assert math.isclose(m["mismatch/ratio_p99"], 3.88, rel_tol=1e-6)
    assert math.isclose(m["mismatch/masked_fraction"], 2 / 7) and m["mismatch/clipped_fraction"] == 0.0
    tis = mismatch_metrics(PROXIMAL, BEHAVIOUR, MASK, correct("tis"))  # only the 4 is truncated
    assert tis["mismatch/masked_fraction"] == 0.0 and math.isclose(tis["mismatch/clipped_fraction"], 1 / 7)
    same = mismatch_metrics(PROXIMAL, PROXIMAL, MASK, correct("none"))
    assert same["mismatch/kl_k3"] == 0.0 and same["mismatch/abs_log_ratio_max"] == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mismatch_metrics_on_cuda_equal_the_cpu_ones():
    # the percentiles' levels must be made on the logprobs' device: a CPU tensor there stops every GPU step
    on_cpu = mismatch_metrics(PROXIMAL, BEHAVIOUR, MASK, correct("mis"))
    on_gpu = mismatch_metrics(PROXIMAL.cuda(), BEHAVIOUR.cuda(), MASK.cuda())
    assert {k: on_gpu[k] for k in on_gpu} == pytest.approx({k: on_cpu[k] for k in on_gpu}, rel=1e-6)


# --- keys and checks ---------------------------------------------------------------------------------------
def test_the_old_cap_key_is_refused_with_its_new_name():
    with pytest.raises(ConfigError, match=r"algorithm.is_correction_cap' has moved: use "
                                          r"actor.loss.is_correction=tis with actor.loss.is_cap"):
        check_overrides(ReasoningConfig, ["algorithm.is_correction_cap=2.0"])


@pytest.mark.parametrize("keys, message", [
    (dict(objective="decoupled_ppo"), r"actor.loss.objective='decoupled_ppo' is about the trainer's proximal logprobs: "
                                 r"it needs algorithm.recompute_logprobs=true"),
    (dict(is_correction="mis"), r"actor.loss.is_correction='mis' is about .* algorithm.recompute_logprobs=true"),
    (dict(recompute_logprobs=True, is_correction="tis", is_low=0.1),
     r"actor.loss.is_low=0.1 is an option of actor.loss.is_correction=icepop \| mis \| seq_mask; "
     r"actor.loss.is_correction=tis does not read it"),
    (dict(recompute_logprobs=True, is_correction="mis", is_low=2.0, is_high=1.5), r"is_low=2.0 must be below"),
])
def test_off_policy_checks_name_the_key(keys, message):
    loss = {k: v for k, v in keys.items() if k != "recompute_logprobs"}  # the parametrized dict stays as it is
    with pytest.raises(ValueError, match=message):
        check_off_policy(AlgorithmConfig(recompute_logprobs=keys.get("recompute_logprobs", False)), LossConfig(**loss))


def test_the_multinode_runs_tis_overrides_parse():
    check_overrides(ReasoningConfig, ["actor.loss.is_correction=tis", "actor.loss.is_cap=2.0",
                                      "algorithm.recompute_by_length=true"])


def test_the_closing_table_shows_the_mismatch_when_there_is_one():
    from rlinf_like.runners.reasoning.run import closing_table

    assert closing_table([{"step": 5, "eval_accuracy": 0.5}]) == "  step  eval_accuracy\n     5          0.500"
    table = closing_table([{"step": 5, "eval_accuracy": 0.5},
                           {"step": 10, "eval_accuracy": 0.75, "mismatch/kl_k3": 1.5e-9, "mismatch/masked_fraction": 0.25}])
    assert table.splitlines() == ["  step  eval_accuracy  mismatch_kl  masked",
                                  "     5          0.500            -       -",
                                  "    10          0.750     1.50e-09   0.250"]
    # from a whole history: the evaluated rows, reward, response length and step time averaged since the row above
    history = [{"step": 0, "eval_accuracy": 0.5}, {"step": 1, "reward": 0.2, "response_tokens": 10.0, "step_s": 1.0},
               {"step": 2, "reward": 0.4, "response_tokens": 20.0, "step_s": 3.0, "eval_accuracy": 0.75}]
    assert closing_table(history).splitlines() == [
        "  step  eval_accuracy  mean_reward  mean_resp_len  mean_step_s",
        "     0          0.500            -              -            -",
        "     2          0.750        0.300           15.0         2.00"]


def test_registry_choices_are_checked_by_name():
    from rlinf_like.runners.reasoning.checks import check_choices

    cfg = ReasoningConfig()
    cfg.actor.loss.objective = "grpo_loss"
    with pytest.raises(ValueError, match=r"actor.loss.objective='grpo_loss' is not one of \[.decoupled_ppo., .ppo.\]"):
        check_choices(cfg)
    check_off_policy(AlgorithmConfig(recompute_logprobs=True),  # a valid combination passes
                     LossConfig(objective="decoupled_ppo", is_correction="seq_mask", is_low=0.9, is_high=1.1))


# --- end to end ----------------------------------------------------------------------------------------------
def small(out, max_steps):
    """The small run on a smaller model, with a reward that differs within each group from the first step
    (an untrained model's answers all score 0 under the math reward: no advantage, no update, no mismatch)."""
    from small_runs import small_reasoning_config

    cfg = small_reasoning_config(out, max_steps=max_steps)
    m = cfg.model
    m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads = 32, 64, 2, 1
    cfg.reward.fn = "user_rewards:digits"
    return cfg


def decoupled_pipelined(out):
    """The pipelined preset's placement and staleness (actor on slot 0; rollout and reward on slot 1, one
    version ahead) on the small run: 2 steps of decoupled PPO with masked IS, its range narrow enough that
    step 2's one-version-old samples have tokens outside it."""
    cfg = small(out, max_steps=2)
    cfg.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "1"}
    cfg.cluster.backend = "local"  # one rank each: in process
    cfg.runner.max_staleness = 1
    cfg.actor.precision = "fp32"  # step 1's ratios within ulps of 1 hold when trainer and engine both run fp32
    cfg.algorithm.recompute_logprobs, loss = True, cfg.actor.loss
    loss.objective, loss.is_correction, loss.is_low, loss.is_high = "decoupled_ppo", "mis", 0.99, 1.01
    return cfg


def on_policy_fp32(out, by_length=False):
    """The true on-policy check's run: collocated, the native engine in fp32 scoring the finished responses
    again (`rescored`), the trainer's recomputed logprobs (padded batches, or one forward per row length);
    one step of the main job's response length (28 tokens: padding varies between rows)."""
    from small_runs import in_process

    cfg = in_process(small(out, max_steps=1))  # one actor rank and one rollout replica, in process
    cfg.runner.schedule, cfg.runner.max_new_tokens = "collocated", 28
    cfg.rollout.engine, cfg.rollout.dtype, cfg.rollout.logprobs = "native", "float32", "rescored"
    cfg.actor.precision = "fp32"  # both sides in fp32 (auto would pick bf16 training on a CPU with bf16 units)
    cfg.algorithm.recompute_logprobs, cfg.algorithm.recompute_by_length = True, by_length
    return cfg


def train_history(make, out):
    """In a spawned process (a run owns its Ray; the test session's may be taken)."""
    from rlinf_like.runners.reasoning import train

    return train(make(out)).history


RUNS = {"decoupled_history": decoupled_pipelined, "on_policy_history": on_policy_fp32,
        "by_length_history": partial(on_policy_fp32, by_length=True)}


@pytest.fixture(scope="module")
def started_runs(request, tmp_path_factory):
    """The runs the selected tests need, two at a time, each in its own spawned process with its own local Ray
    (a single small run leaves a core idle much of the time); a test run alone starts only its own."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    needed = [name for name in RUNS if any(name in getattr(item, "fixturenames", ()) for item in request.session.items)]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield {name: pool.submit(train_history, RUNS[name], tmp_path_factory.mktemp(name)) for name in needed}


@pytest.fixture(scope="module")
def decoupled_history(started_runs):
    return started_runs["decoupled_history"].result(timeout=600)


@pytest.fixture(scope="module")
def on_policy_history(started_runs):
    return started_runs["on_policy_history"].result(timeout=600)


@pytest.fixture(scope="module")
def by_length_history(started_runs):
    return started_runs["by_length_history"].result(timeout=600)


MISMATCH_KEYS = {"mismatch/kl_k3", "mismatch/abs_log_ratio_mean", "mismatch/abs_log_ratio_max", "mismatch/ratio_p1",
                 "mismatch/ratio_p50", "mismatch/ratio_p99", "mismatch/masked_fraction", "mismatch/clipped_fraction"}


@pytest.mark.timeout(600)
def test_pipelined_decoupled_ppo_with_mis_logs_the_mismatch_every_step(decoupled_history):
    steps = decoupled_history[1:]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert MISMATCH_KEYS <= set(h) and all(math.isfinite(h[k]) for k in MISMATCH_KEYS)
        assert h["mismatch/kl_k3"] >= 0 and h["mismatch/ratio_p1"] <= h["mismatch/ratio_p50"] <= h["mismatch/ratio_p99"]
        assert h["mismatch/clipped_fraction"] == 0.0  # mis masks, never truncates
    first, second = steps
    assert first["staleness"] == 0.0 and second["staleness"] == 1.0  # one version behind from step 2
    # step 1: the same weights on both sides, padded batches: ratios within a few ulps of 1, nothing masked
    assert first["mismatch/abs_log_ratio_max"] < 1e-5 and first["mismatch/masked_fraction"] == 0.0
    # step 2 trains on version-0 samples against the trainer's version 1: a real mismatch, partly masked
    assert second["mismatch/abs_log_ratio_max"] > 1e-3 and 0.0 < second["mismatch/masked_fraction"] < 1.0


# The true on-policy check. Step 1 recomputes before any update, so the trainer's proximal logprobs and the
# engine's rescored ones come from the same fp32 weights and differ only by numerics. Measured (this seed, 16 rows
# of up to 28 new tokens, 418 response tokens), padded batches: with two actor ranks on Ray, on an AVX2 AMD EPYC one
# token was one float32 ulp apart (2^-21 at |logprob| in [4, 8)), mean 1.14e-9; on a Zen 4 (AVX-512) host the mean
# was 2.28e-9, two tokens; with one rank in process on that Zen 4 host, 2.28e-9 and one ulp at most.
# Which tokens land one ulp apart follows the CPU's attention kernels, so the bounds allow any CPU a few such tokens
# and nothing more: no token more than one ulp apart for |logprob| < 16 (2^-20), and at most 8 of the 418 tokens
# at that (mean <= 8 * 2^-20 / 418 = 1.8e-8). A change of numerics (1e-6 and up) is far outside both.
PADDED_GAP_MEAN, PADDED_GAP_MAX = 8 * 2.0**-20 / 418, 2.0**-20


@pytest.mark.timeout(600)
def test_on_policy_step_one_gap_with_padded_recompute_is_within_the_measured_bound(on_policy_history):
    h = on_policy_history[1]
    assert h["rollout_trainer_logprob_gap"] <= PADDED_GAP_MEAN
    assert h["mismatch/abs_log_ratio_max"] <= PADDED_GAP_MAX


@pytest.mark.timeout(600)
def test_on_policy_step_one_is_bit_identical_when_recomputed_by_length(by_length_history):
    """One unpadded forward per row length: the trainer runs each row as the engine's scoring pass does, and
    the step-1 importance ratio is exactly 1 on every token."""
    h = by_length_history[1]
    assert h["rollout_trainer_logprob_gap"] == 0.0 and h["mismatch/abs_log_ratio_max"] == 0.0
    assert h["mismatch/ratio_p1"] == h["mismatch/ratio_p99"] == 1.0 and h["mismatch/kl_k3"] == 0.0


def test_the_cause_padding_changes_the_trainers_last_bits_and_by_length_removes_it(tmp_path):
    """No Ray: the native engine's scoring pass against the trainer's HF forward, same fp32 weights. The engine
    equals the HF model on each row alone, bit for bit; a padded batch (attention over the longest row's
    length) moves some tokens by an ulp, whatever the batch size; `logprobs_by_length` gives the row-alone
    numbers back."""
    from transformers import AutoModelForCausalLM

    from rlinf_like.hybrid_engines.model_manager import logprobs_by_length, token_logprobs
    from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
    from rlinf_like.workers.rollout.engines.native.model import (
        Decoder, fuse_projections, load_shards, model_config, weight_layouts)

    path = write_tiny_model(tmp_path / "m", TinyModelSpec(hidden_size=128, intermediate_size=352, init_std=0.02))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    cfg = model_config(path)
    decoder = Decoder(cfg, fuse_projections(cfg, load_shards(path, weight_layouts(cfg, 1, torch.float32), 0,
                                                             torch.float32)))
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, cfg.vocab_size, (int(n),), generator=g) for n in torch.randint(20, 60, (16,), generator=g)]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
    with torch.no_grad():
        padded = token_logprobs(hf, {"input_ids": ids, "attention_mask": mask})
        by_length = logprobs_by_length(lambda b: token_logprobs(hf, b), {"input_ids": ids, "attention_mask": mask},
                                       mask.sum(1).unique().tolist())
        engine = [torch.log_softmax(decoder.score(r)[:-1], -1).gather(-1, r[1:, None])[:, 0] for r in rows]
    differ = sum(int((e != padded[i, : len(e)]).sum()) for i, e in enumerate(engine))
    assert differ > 0  # the cause: if this ever reaches 0, padded recompute became exact too
    for i, e in enumerate(engine):
        assert torch.equal(e, by_length[i, : len(e)])
        assert (e - padded[i, : len(e)]).abs().max() <= 2 * 2.0**-21  # an ulp or two where they differ
