"""Shared prompts in training (`actor.loop.share_prompt`, hybrid_engines/prompt_sharing.py): each group laid out as
[prompt, r1, ..., rn] gives every row's logprobs, entropy and gradient as the rows one by one do, a response sees
the prompt and its own past only, micro-batches hold whole groups, and what cannot share is refused by name."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.model_manager import token_stats
from rlinf_like.hybrid_engines.prompt_sharing import SharedPrompts, share_batch, unsupported
from rlinf_like.training.loop import LoopConfig, LoopTerms, check_loop, plan_steps, resolve_share_prompt
from small_runs import in_process, small_reasoning_config

# (prompt tokens, samples) per group: groups of several samples, and one of a single sample
GROUPS = [(7, 3), (5, 1), (9, 4)]


def tiny_llama(attention: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    cfg._attn_implementation = attention
    return LlamaForCausalLM(cfg).float()


def grouped_batch(seed: int = 1) -> dict:
    """GRPO-shaped rows whose groups are shuffled among each other (sharing must not need them adjacent)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for length, samples in GROUPS:
        prompt = torch.randint(4, 64, (length,), generator=g).tolist()
        for _ in range(samples):
            prompts.append(prompt)
            responses.append(torch.randint(4, 64, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist())
    order = torch.randperm(len(prompts), generator=g).tolist()
    prompts, responses = [prompts[i] for i in order], [responses[i] for i in order]
    advantages = torch.randn(len(prompts), generator=g).tolist()
    return build_rl_batch(prompts, responses, [[-1.0] * len(r) for r in responses], advantages)


def uniform_groups(groups: int, samples: int, answer_tokens: int, seed: int) -> dict:
    """`groups` GRPO groups of `samples` rows each: a random 10-token prompt, an answer of `answer_tokens` tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(groups):
        prompt = torch.randint(4, 64, (10,), generator=g).tolist()
        prompts += [prompt] * samples
        responses += [[5] * answer_tokens] * samples
    return build_rl_batch(prompts, responses, [[-1.0] * len(r) for r in responses], [1.0] * len(prompts))


def stats_and_grads(model, batch):
    model.zero_grad()
    logprobs, entropy = token_stats(model, batch, 0.7, entropy_grad=True)
    mask = batch["response_mask"]
    ((logprobs * batch["advantages"] + 0.1 * entropy) * mask).sum().backward()
    return logprobs.detach() * mask, entropy.detach() * mask, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_each_prompt_runs_once_and_every_row_gets_its_own_logprobs_entropy_and_gradient(attention):
    model, batch = tiny_llama(attention), grouped_batch()
    shared = share_batch(batch)
    plan = shared["shared_prompts"]
    rows = int(batch["attention_mask"].sum())
    saved = sum(p * (n - 1) for p, n in GROUPS)
    assert plan.input_ids.shape[0] == len(GROUPS) and plan.tokens == rows - saved  # each prompt laid out once

    lp, ent, grads = stats_and_grads(model, batch)
    lp_s, ent_s, grads_s = stats_and_grads(model, shared)
    assert (lp - lp_s).abs().max() <= 1e-6 * lp.abs().max()
    assert (ent - ent_s).abs().max() <= 1e-6 * ent.abs().max()
    norm = torch.sqrt(sum((a ** 2).sum() for a in grads))
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(grads, grads_s)))
    assert 0 < diff / norm <= 1e-5 or diff == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_shared_prompts_on_cuda_give_the_rows_logprobs_and_gradient(monkeypatch):
    """On CUDA, SDPA takes the boolean 4-D mask through another kernel than on CPU (cuDNN's or the
    memory-efficient one): in fp32 (TF32 off) the shared layout gives the rows' logprobs, entropy and gradient."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # restored for the worker's next test
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model = tiny_llama().cuda()
    rows = grouped_batch()
    batch = {k: v.cuda() for k, v in rows.items()}
    shared = {k: v.to("cuda") for k, v in share_batch(rows).items()}
    lp, ent, grads = stats_and_grads(model, batch)
    lp_s, ent_s, grads_s = stats_and_grads(model, shared)
    assert lp.is_cuda and torch.isfinite(lp_s).all()
    assert (lp - lp_s).abs().max() <= 1e-5 * lp.abs().max()
    assert (ent - ent_s).abs().max() <= 1e-5 * ent.abs().max()
    norm = torch.sqrt(sum((a ** 2).sum() for a in grads))
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(grads, grads_s)))
    assert diff / norm <= 1e-5


def test_a_response_sees_the_prompt_and_its_own_past_only():
    model, batch = tiny_llama(), grouped_batch()
    prompts = batch["prompt_lengths"]
    lengths = batch["attention_mask"].sum(1)
    group = [b for b in range(len(prompts)) if int(prompts[b]) == GROUPS[2][0]]  # the 4-sample group
    with torch.no_grad():
        before = token_stats(model, share_batch(batch))[0]
        for victim in (group[0], group[-1]):  # the first laid out and the last: no response sees another, either way
            changed = {k: v.clone() for k, v in batch.items()}
            p, n = int(prompts[victim]), int(lengths[victim])
            changed["input_ids"][victim, p:n] = (changed["input_ids"][victim, p:n] + 1) % 60 + 4
            after = token_stats(model, share_batch(changed))[0]
            others = [b for b in range(len(prompts)) if b != victim]
            assert torch.equal(after[others], before[others]), f"changing row {victim}'s response moved another row"
            assert not torch.equal(after[victim], before[victim])
    mask = SharedPrompts.plan(batch["input_ids"], batch["attention_mask"], prompts).mask
    assert bool(mask.any(-1).all())  # no query row without a key: SDPA would give NaN there


def test_micro_batches_hold_whole_groups_and_cover_every_row_once():
    batch = grouped_batch()
    loop = LoopConfig(micro_batch_size=4, mini_batches=1, share_prompt="true")
    steps = list(plan_steps(batch, 0, 1, loop, step=0))
    micros = [m for step in steps for m, _ in step]
    assert all("shared_prompts" in m for m in micros)
    seen = []
    for m in micros:
        keys = {tuple(m["input_ids"][b, : int(m["prompt_lengths"][b])].tolist()) for b in range(len(m["input_ids"]))}
        assert m["shared_prompts"].input_ids.shape[0] == len(keys)  # one laid-out row per group in it
        seen += [tuple(r.tolist()) for r in m["input_ids"]]
    assert sorted(seen) == sorted(tuple(r.tolist()) for r in batch["input_ids"])
    # a group is the unit: none is split over two micro-batches, each filled up to 4 rows (3 + 1, then 4)
    home = {}
    for i, m in enumerate(micros):
        for b in range(len(m["input_ids"])):
            assert home.setdefault(tuple(m["input_ids"][b, : int(m["prompt_lengths"][b])].tolist()), i) == i
    assert sorted(len(m["input_ids"]) for m in micros) == [4, 4]
    assert all(abs(scale - 1 / len(micros)) < 1e-12 for step in steps for _, scale in step)
    # SFT rows carry no prompt lengths: they run as rows
    sft = {k: batch[k] for k in ("input_ids", "attention_mask")}
    assert all("shared_prompts" not in m for step in plan_steps(sft, 0, 1, loop, step=0) for m, _ in step)


def test_a_memory_budget_fills_micro_batches_with_laid_out_positions_and_every_rank_runs_as_many():
    """Without actor.loop.micro_batch_size the memory budget (tokens) sizes micro-batches: shared groups count their
    laid-out positions, not their rows x padded length; ranks whose groups fill fewer micro-batches split theirs."""
    batch = uniform_groups(8, 4, 3, seed=3)  # 10 prompt tokens, answers of 3: 22 positions laid out, rows of 13
    loop, budget = LoopConfig(share_prompt="true"), 60
    plans = [list(plan_steps(batch, r, 2, loop, step=0, terms=LoopTerms(micro_batch_tokens=budget))) for r in (0, 1)]
    for plan in plans:  # 2 groups (44 positions) a micro-batch; by rows 60 // 13 = 4 rows, one group
        micros = [m for step in plan for m, _ in step]
        assert [m["shared_prompts"].input_ids.shape for m in micros] == [(2, 22), (2, 22)]
        assert sum(len(m["input_ids"]) for m in micros) == 16

    from rlinf_like.training.loop import _split_to

    assert _split_to([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]  # the fullest halves: less memory each
    assert _split_to([[0, 1, 2, 3]], 3) == [[0], [1], [2, 3]]
    assert _split_to([[0], [1]], 3) is None  # nothing left to split: that step is planned by rows


def test_a_group_longer_than_the_memory_budget_is_planned_by_rows_within_the_budget():
    """A micro-batch of shared groups holds at least one group; where one group's laid-out positions exceed the
    memory budget, the batch is planned by rows instead, so that no micro-batch is laid out over the budget."""
    batch = uniform_groups(4, 8, 20, seed=4)  # 10 prompt tokens, answers of 20: 170 positions laid out, rows of 30
    budget = 100  # 3 rows of 30 by rows; not one group of 170 positions
    for r in (0, 1):
        micros = [m for step in plan_steps(batch, r, 2, LoopConfig(share_prompt="true"), step=0,
                                           terms=LoopTerms(micro_batch_tokens=budget)) for m, _ in step]
        assert sum(len(m["input_ids"]) for m in micros) == 16
        assert all(len(m["input_ids"]) <= 3 for m in micros)
        assert all(m["shared_prompts"].input_ids.numel() <= budget for m in micros if "shared_prompts" in m)


def test_share_prompt_true_is_refused_where_it_cannot_run(monkeypatch):
    with pytest.raises(ValueError, match=r"actor.loop.share_prompt=true does not combine with "
                                         r"actor.loop.pack_sequences=true"):
        check_loop(LoopConfig(share_prompt="true", pack_sequences=True), "actor.loop")
    plain = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    assert unsupported(plain) and unsupported(tiny_llama("flex_attention"))
    with pytest.raises(ValueError, match=r"^actor.loop.share_prompt=true: attention 'flex_attention'"):
        resolve_share_prompt(LoopConfig(share_prompt="true"), tiny_llama("flex_attention"))
    assert resolve_share_prompt(LoopConfig(), tiny_llama("flex_attention")).share_prompt == "false"  # auto: off
    assert resolve_share_prompt(LoopConfig(), tiny_llama()).share_prompt == "true"  # auto: on where it can
    assert resolve_share_prompt(LoopConfig(pack_sequences=True), tiny_llama()).share_prompt == "false"

    from rlinf_like.config import cli
    from rlinf_like.runners.reasoning.checks import check_config
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    from hydra.core.config_store import ConfigStore

    from rlinf_like.config.schema import hydra_schema

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    monkeypatch.setattr(cli, "_USER_KEYS", None)  # what a command line recorded stays with its test
    monkeypatch.setattr(cli, "_SET_KEYS", None)
    main = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "main_grpo.py"

    def composed(*argv):
        prepared = cli.prepare_command_line(ReasoningConfig, list(argv), main, "grpo_collocated")
        return cli.composed(ReasoningConfig, main.parent / "config", "grpo_collocated", prepared)

    assert composed("actor.loop.share_prompt=true").actor.loop.share_prompt == "true"  # hydra reads a bool
    assert composed().actor.loop.share_prompt == "auto"
    with pytest.raises(ValueError, match=r"actor.loop.share_prompt=true: actor.backend=megatron does not lay out "
                                         r"shared prompts \(backends that do: \['fsdp'\]\)"):
        check_config(composed("actor.loop.share_prompt=true", "actor.backend=megatron"))


def test_a_run_that_shares_prompts_trains_like_one_that_does_not(tmp_path):
    """One step of the small run in one micro-batch, with a KL reference, sharing and not: the same loss, entropy,
    KL and gradient norm (the same sums in another order)."""
    from rlinf_like.runners.reasoning import train

    got = {}
    for share in ("false", "true"):
        cfg = in_process(small_reasoning_config(tmp_path / share, max_steps=1),
                         {"actor,rollout": "0", "reward": "1", "reference": "1"})
        cfg.actor.loop = replace(cfg.actor.loop, share_prompt=share, micro_batch_size=16)
        cfg.actor.loss.entropy_coef = 0.01  # a loss with a gradient even when every reward is equal
        cfg.algorithm.kl_beta = 0.05  # and a reference worker, which shares prompts as the actor does
        cfg.actor.precision = "fp32"
        train(cfg)
        got[share] = json.loads((tmp_path / share / "checkpoint" / "runner.json").read_text())["history"][1]
    for key in ("loss", "entropy", "grad_norm", "kl"):
        assert got["true"][key] == pytest.approx(got["false"][key], rel=1e-5, abs=1e-7), key
    assert got["true"]["grad_norm"] > 0


def test_a_group_is_laid_out_shared_only_where_its_dense_mask_costs_less_than_its_rows():
    from rlinf_like.utils.flops import ModelShape, shares

    smollm2 = ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
    cost = smollm2.pair_cost
    assert 3e-4 < cost < 4e-4

    def group(prompt: int, responses: list[int]) -> dict:
        return build_rl_batch([list(range(4, 4 + prompt))] * len(responses), [[5] * r for r in responses],
                              [[0.0] * r for r in responses], [0.0] * len(responses))

    # the default preset's shapes: a 36-token prompt, 8 answers of up to 28 tokens -> about half the work
    short = group(36, [28] * 8)
    assert "shared_prompts" in share_batch(short, cost) and shares(smollm2, 36, [28] * 8)
    # GSM8K-like: 8 answers of 600 tokens after a 100-token prompt; the dense 4,900-position mask costs more
    long = group(100, [600] * 8)
    assert "shared_prompts" not in share_batch(long, cost) and not shares(smollm2, 100, [600] * 8)
    assert "shared_prompts" in share_batch(long, 0.0)  # no cost given: always shared


def tinker_groups(seed: int = 5) -> list[list[int]]:
    """Token rows as a Tinker client sends GRPO samples: one few-shot prefix for all, three questions of their own
    with three sampled answers each, and one row alone; shuffled, and nothing says where a prompt ends."""
    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(4, 64, (n,), generator=g).tolist()  # noqa: E731
    few_shot, rows = draw(12), []
    for _ in range(3):
        question = few_shot + draw(6)
        rows += [question + draw(int(torch.randint(2, 9, (1,), generator=g))) for _ in range(3)]
    rows.append(draw(10))
    return [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]


def test_rows_that_do_not_say_where_their_prompt_ends_share_their_question_not_only_the_few_shot_prefix():
    from rlinf_like.hybrid_engines.prompt_sharing import common_prefixes

    rows = tinker_groups()
    groups = prompt_groups(rows, common_prefixes(rows, 3.3e-4))  # SmolLM2's pair cost
    assert sorted(len(g) for g in groups.values()) == [1, 3, 3, 3]  # each question's answers, and the lone row
    assert all(len(prompt) >= 18 for prompt, g in groups.items() if len(g) == 3)  # few-shot prefix + question
    # a 4-token prompt with answers of 60: one laid-out sequence's attention would cost more than the prompt's repeats
    long = [[1, 2, 3, 4, *range(10 + i, 70 + i)] for i in range(3)]
    assert sorted(len(g) for g in prompt_groups(long, common_prefixes(long, 0.05)).values()) == [1, 1, 1]
    assert sorted(len(g) for g in prompt_groups(long, common_prefixes(long, 1e-4)).values()) == [3]


def prompt_groups(rows: list[list[int]], prefixes: list[int]) -> dict:
    """Rows by the prompt they share: a lone row (its prompt all but its last token) is its own group."""
    out = {}
    for i, (row, p) in enumerate(zip(rows, prefixes, strict=True)):
        out.setdefault(tuple(row[:p]) if p < len(row) - 1 else i, []).append(row)
    return out


def tinker_layout(rows: list[list[int]]) -> SharedPrompts:
    """The shared layout the Tinker server's `target_logprobs` gives `rows` (its prefixes found by the cost rule)."""
    from rlinf_like.hybrid_engines.prompt_sharing import common_prefixes

    return share_batch({"input_ids": torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], True),
                        "attention_mask": torch.nn.utils.rnn.pad_sequence([torch.ones(len(r)) for r in rows], True),
                        "prompt_lengths": torch.tensor(common_prefixes(rows, 3.3e-4))}, 3.3e-4)["shared_prompts"]


def head_rows(monkeypatch) -> list[tuple[int, bool]]:
    """Each output-layer chunk's rows and whether autograd was on, as `head_stats` runs them from now on."""
    from rlinf_like.hybrid_engines import head_stats

    seen = []
    real = getattr(head_stats._rows_stats, "__wrapped__", head_stats._rows_stats)  # not an earlier counter

    def counted(hidden, *rest):
        seen.append((len(hidden), torch.is_grad_enabled()))
        return real(hidden, *rest)
    counted.__wrapped__ = real
    monkeypatch.setattr(head_stats, "_rows_stats", counted)
    return seen


def test_tinker_data_run_their_common_prefix_once_with_the_logprobs_and_gradient_of_rows():
    from rlinf_like.tinker.losses import Datum, _any_target_logprobs, target_logprobs

    model = tiny_llama()
    rows = tinker_groups()
    data = [Datum(row[:-1], {"target_tokens": torch.tensor(row[1:])}) for row in rows]
    assert tinker_layout(rows).tokens < sum(map(len, rows)) - 2 * 3 * 17  # each group's prompt once

    def run(how):
        model.zero_grad()
        logprobs = how()
        torch.stack([lp.sum() * (i + 1) for i, lp in enumerate(logprobs)]).sum().backward()
        return [lp.detach() for lp in logprobs], torch.cat([p.grad.flatten() for p in model.parameters()])

    shared, shared_grad = run(lambda: target_logprobs(model, data, 3.3e-4))
    plain, plain_grad = run(lambda: target_logprobs(model, data))
    every, every_grad = run(lambda: _any_target_logprobs(model, data, torch.device("cpu")))
    for a, b, c, d in zip(shared, plain, every, data, strict=True):
        assert a.shape == (len(d.tokens),)
        torch.testing.assert_close(a, c, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(b, c, rtol=1e-6, atol=1e-6)
    assert (shared_grad - every_grad).norm() <= 1e-5 * every_grad.norm()
    assert (plain_grad - every_grad).norm() <= 1e-5 * every_grad.norm()


def test_a_shared_prompt_position_runs_the_output_layer_once_for_all_its_rows(monkeypatch):
    """Tinker data score every position: a group's rows read their shared prompt at the same hidden states with the
    same next tokens, and the output layer runs once per distinct (state, next token), not once per row."""
    from rlinf_like.tinker.losses import Datum, target_logprobs

    rows = tinker_groups()
    data = [Datum(row[:-1], {"target_tokens": torch.tensor(row[1:])}) for row in rows]
    seen = head_rows(monkeypatch)
    with torch.no_grad():
        target_logprobs(tiny_llama(), data, 3.3e-4)
    # each laid-out position predicts one next token, but a group's last shared position predicts each row's own
    source = tinker_layout(rows).source
    distinct = {(int(s), row[t + 1]) for b, row in enumerate(rows) for t, s in enumerate(source[b, :len(row) - 1])}
    assert sum(n for n, _ in seen) == len(distinct) < sum(len(r) - 1 for r in rows)


def test_tinker_positions_with_a_zero_advantage_run_the_output_layer_without_a_gradient(monkeypatch):
    """An RL datum's prompt positions carry advantage 0: their logprobs are still returned, but the output layer runs
    there without autograd (no recompute, no backward), and the gradient and logprobs are those of an all-graded run."""
    from rlinf_like.tinker import losses

    model, rows, g = tiny_llama(), tinker_groups(), torch.Generator().manual_seed(3)
    data = []
    for row in rows:
        n = len(row) - 1
        advantages = torch.zeros(n)
        advantages[-3:] = torch.randn(3, generator=g)  # the sampled answer's last three targets
        data.append(losses.Datum(row[:-1], {"target_tokens": torch.tensor(row[1:]), "advantages": advantages,
                                            "logprobs": -torch.rand(n, generator=g)}))
    every = losses.differentiated

    def run(graded):
        monkeypatch.setattr(losses, "differentiated", graded)
        seen = head_rows(monkeypatch)
        model.zero_grad()
        outputs = []
        loss = losses.loss_closure(data, "importance_sampling", None, outputs, 3.3e-4)(model, {})[0]
        forward = list(seen)  # before the backward's recomputes
        loss.backward()
        return [o["logprobs"] for o in outputs], torch.cat([p.grad.flatten() for p in model.parameters()]), forward

    lp, grad, forward = run(every)
    lp_all, grad_all, forward_all = run(lambda fn, inputs: torch.ones(len(inputs["target_tokens"]), dtype=torch.bool))
    for a, b in zip(lp, lp_all, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert 0 < (grad - grad_all).norm() <= 1e-5 * grad_all.norm() or torch.equal(grad, grad_all)
    graded_rows = sum(n for n, grad_on in forward if grad_on)
    assert sum(n for n, _ in forward) == sum(n for n, _ in forward_all)  # every position's value still computed
    assert 0 < graded_rows <= 3 * len(rows) < sum(n for n, grad_on in forward_all if grad_on)


def test_a_tinker_step_whose_advantages_are_all_zero_still_runs_its_backward():
    """A recipe's step where every group's rewards were equal: the loss is 0 and so is its gradient, but the
    backward must still run (the output layer then runs under autograd everywhere)."""
    from rlinf_like.tinker import losses

    model = tiny_llama()
    data = [losses.Datum(row[:-1], {"target_tokens": torch.tensor(row[1:]), "advantages": torch.zeros(len(row) - 1),
                                    "logprobs": torch.zeros(len(row) - 1)}) for row in tinker_groups()]
    loss = losses.loss_closure(data, "importance_sampling", None, [], 3.3e-4)(model, {})[0]
    loss.backward()
    assert float(loss) == 0 and all(p.grad is None or not p.grad.any() for p in model.parameters())
