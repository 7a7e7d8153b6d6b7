"""Sequence packing and token-budget micro-batching: packed and padded paths give the same per-token
logprobs, losses and gradients (fp32 tolerance); token-budget micro-batches accumulate to exactly the
gradient of the whole mini-batch, on 2 gloo FSDP ranks and on Megatron DP=2."""

import importlib.util

import pytest
import torch

from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs, token_nll_loss
from rlinf_like.hybrid_engines.packing import Packing, pack_batch
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runtime import Worker
from rlinf_like.workers.actor.loss import LossConfig, LossTerms, rl_loss
from rlinf_like.training.batch_resizer import concat_batches
from rlinf_like.training.micro_batching import balanced_partition, token_budget_plan, trim_padding
from rlinf_like.training.loop import LoopConfig, check_loop, loss_tokens, train_epochs

LENGTHS = [24, 5, 17, 9, 3, 21, 12, 8]
WIDTH = 26  # two columns of padding after the longest row


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float()


def rl_batch(vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(WIDTH)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = torch.randint(4, vocab, (len(LENGTHS), WIDTH), generator=g) * mask
    response = torch.zeros(len(LENGTHS), WIDTH - 1)
    for i, n in enumerate(LENGTHS):
        response[i, n // 2 - 1:n - 1] = 1  # the second half of each row is the "response"
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": torch.cat([torch.zeros_like(mask[:, :1]),
                                                                            response.long()], 1),
            "response_mask": response, "old_logprobs": -torch.rand(len(LENGTHS), WIDTH - 1, generator=g) * response,
            "advantages": torch.randn(len(LENGTHS), 1, generator=g) * response}


def test_plan_packs_every_token_once_within_the_budget():
    batch = rl_batch()
    p = Packing.plan(batch["input_ids"], batch["attention_mask"], max_batch_seqlen=32)
    assert p.input_ids.shape[1] <= 32 and p.tokens == sum(LENGTHS)
    assert p.input_ids.shape[0] == 4  # 99 tokens: first-fit decreasing needs ceil(99 / 32) = 4 rows here
    # pack -> unpack is exact on real tokens and zero on padding
    x = torch.randn(len(LENGTHS), WIDTH, 3)
    assert torch.equal(p.unpack(p.pack(x)), x * batch["attention_mask"][..., None])
    assert torch.equal(p.pack(batch["input_ids"]), p.input_ids)
    short = trim_padding({k: v[1:2] for k, v in batch.items()})  # a 5-token row: [1, 5] and [1, 4] tensors
    assert short["input_ids"].shape == (1, 5) and short["response_mask"].shape == (1, 4)
    assert torch.equal(short["old_logprobs"], batch["old_logprobs"][1:2, :4])
    with pytest.raises(ValueError, match="max_batch_seqlen=16 is shorter than the longest sequence"):
        Packing.plan(batch["input_ids"], batch["attention_mask"], 16)
    with pytest.raises(ValueError, match="right-padded rows.*row 0"):
        Packing.plan(batch["input_ids"], batch["attention_mask"].flip(1))


@pytest.mark.parametrize("seqlen", [None, 40])
def test_packed_and_padded_give_the_same_logprobs_loss_and_gradients(seqlen):
    model, batch = tiny_llama(), rl_batch()
    packed = pack_batch(batch, seqlen)
    valid = batch["attention_mask"][:, 1:].bool()
    with torch.no_grad():
        a, b = token_logprobs(model, batch, 0.7), token_logprobs(model, packed, 0.7)
    torch.testing.assert_close(b[valid], a[valid], rtol=0, atol=1e-5)
    assert torch.all(b[~valid] == 0)
    loss_fn = rl_loss(LossConfig(entropy_coef=0.01), LossTerms(temperature=0.7))
    grads = []
    for inputs in (batch, packed):
        model.zero_grad()
        loss, metrics = loss_fn(model, inputs)
        loss.backward()
        grads.append((loss.detach(), metrics["entropy"], [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-5, atol=1e-6)
    assert grads[1][1] == pytest.approx(grads[0][1], rel=1e-5)
    for g_packed, g_padded in zip(grads[1][2], grads[0][2]):
        torch.testing.assert_close(g_packed, g_padded, rtol=1e-4, atol=1e-6)


def test_token_budget_plan_is_balanced_and_equal_in_count():
    lengths = [500, 20, 30, 480, 16, 25, 300, 200, 40, 60, 120, 18]
    plan = token_budget_plan(lengths, world_size=2, max_tokens=600, packed=True)
    assert len(plan[0]) == len(plan[1]) == 2  # 1809 tokens / (2 ranks x 600) -> 2 each
    rows = sorted(i for rank in plan for micro in rank for i in micro)
    assert rows == list(range(len(lengths)))
    for rank in plan:
        for micro in rank:
            assert micro and sum(lengths[i] for i in micro) <= 600
    totals = [sum(lengths[i] for micro in rank for i in micro) for rank in plan]
    assert abs(totals[0] - totals[1]) <= max(lengths)  # vs 1281 / 528 for the first / second half by rows
    # padded cost counts rows x longest: more, smaller micro-batches
    padded = token_budget_plan(lengths, world_size=2, max_tokens=600, packed=False)
    for rank in padded:
        for micro in rank:
            assert len(micro) * max(lengths[i] for i in micro) <= 600
    assert balanced_partition([5, 4, 3, 3, 3], 2) == [[0, 3], [1, 2, 4]]  # loads 8 and 10
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=100 is smaller than a sequence of 500"):
        token_budget_plan(lengths, 2, 100, True)


def test_loop_config_errors_name_the_key():
    with pytest.raises(ValueError, match="actor.loop.max_batch_seqlen=64 needs actor.loop.pack_sequences=true"):
        check_loop(LoopConfig(max_batch_seqlen=64), "actor.loop")
    with pytest.raises(ValueError, match="actor.loop.max_tokens_per_micro_batch must be >= 1"):
        check_loop(LoopConfig(max_tokens_per_micro_batch=0), "actor.loop")
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runners.reasoning import check_config

    cfg = ReasoningConfig()
    loop = cfg.actor.loop
    loop.pack_sequences, loop.max_batch_seqlen, loop.max_tokens_per_micro_batch = True, 512, 256
    with pytest.raises(ValueError, match="actor.loop.max_batch_seqlen=512 exceeds actor.loop.max_tokens_per_micro_batch=256"):
        check_config(cfg)


# --- two ranks -----------------------------------------------------------------------------------------
LOOP = LoopConfig(pack_sequences=True, max_tokens_per_micro_batch=30)  # 99 tokens -> 2 micro-batches per rank


class Trainer(Worker):
    def __init__(self, path):
        self.path, self.manager = path, None

    def build(self, backend):
        from transformers import AutoModelForCausalLM

        optim = OptimConfig(lr=1e-3, weight_decay=0.0, clip_grad=None)
        if backend == "fsdp":
            from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager

            self.manager = FSDPModelManager(AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32),
                                            FSDPConfig(optim=optim))
        else:
            from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager

            self.manager.close() if hasattr(self.manager, "close") else None
            self.manager = MegatronModelManager(self.path, MegatronConfig(optim=optim))

    def logprobs(self, batch):
        mine = {k: v[self.rank::2] for k, v in batch.items()}
        return self.manager.compute_logprobs(mine), self.manager.compute_logprobs(pack_batch(mine))

    def accumulated_grads(self, batch):
        """The loop's plan and scales, stopping before the optimizer step to read the gradients."""
        from rlinf_like.training.loop import token_budget_steps

        plan = token_budget_steps(batch, self.rank, self.world_size, LOOP, torch.Generator().manual_seed(0), loss_tokens)
        for i, (micro, scale) in enumerate(plan[0]):
            self.manager.forward_backward(micro, token_nll_loss, loss_scale=scale, sync_gradients=i == len(plan[0]) - 1)
        grads = {n: p.grad.full_tensor() for n, p in self.manager.model.named_parameters()}
        self.manager.clear_gradients()
        return len(plan[0]), grads

    def train(self, batch):
        return train_epochs(self.manager, batch, token_nll_loss, self.rank, self.world_size, LOOP)

    def weights(self):
        return {n: p.full_tensor() for n, p in self.manager.model.named_parameters()}

    def rl_updates(self, batches, pieces=None):
        """The reasoning runner's two actor paths, RL loss, 2 mini-batches x 2 epochs per batch. Whole
        batches: the hook on each, then `train_epochs`. `pieces`: streamed through a `BatchResizer` into
        global batches of 8 rows, the hook on each, this rank's planned micro-batches into `run_steps`."""
        from rlinf_like.training.batch_resizer import BatchResizer
        from rlinf_like.training.loop import run_steps

        loss = rl_loss(LossConfig())
        if pieces is None:
            return [train_epochs(self.manager, whiten(b), loss, self.rank, 2, RL_LOOP) for b in batches]
        resizer = BatchResizer(pieces, 8, [whiten], rank=self.rank, world_size=2, loop=RL_LOOP)
        return [run_steps(self.manager, resizer.rank_steps(b, self.rank, self.manager.step), loss)
                for b in resizer.global_batches()]


RL_LOOP = LoopConfig(pack_sequences=True, max_tokens_per_micro_batch=30, mini_batches=2, epochs=2)


def whiten(batch):
    """An advantage hook that needs the whole global batch (its mean and std)."""
    from rlinf_like.algorithms import masked_whiten

    return {**batch, "advantages": masked_whiten(batch["advantages"], batch["response_mask"])}


def pieces_of(batch, sizes):
    """Consecutive row groups, each cut to its own width (as streamed rollout groups arrive)."""
    out, start = [], 0
    for n in sizes:
        rows = slice(start, start + n)
        width = int(batch["attention_mask"][rows].sum(1).max())
        out.append({k: v[rows, :width + v.shape[1] - WIDTH] if v.dim() == 2 else v[rows] for k, v in batch.items()})
        start += n
    return out


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    write_tiny_model(path, TinyModelSpec(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=2,
                                         num_heads=4, num_kv_heads=2, init_std=0.05))
    return str(path)


def test_token_budget_micro_batches_accumulate_the_whole_batch_gradient_and_the_resizer_path_matches(cluster, model_path):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    vocab = ref.config.vocab_size
    batch = rl_batch(vocab)
    loss, _ = token_nll_loss(ref, batch)  # unsplit, unpacked, one process
    loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    ref_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in ref_grads.values()])).item()
    with torch.no_grad():
        ref_logprobs = token_logprobs(ref, batch)

    group = Trainer.create_group(model_path).launch(cluster, cluster.place({"trainer": "0-1"}), "trainer")
    try:
        group.build("fsdp").wait(timeout=120)
        for (count, grads) in group.accumulated_grads(batch).wait(timeout=120):
            assert count == 2
            for name, g in ref_grads.items():
                torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6)
        for metrics in group.train(batch).wait(timeout=120):
            assert metrics["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)

        # the pipelined runner's resizer path (16 rows streamed in pieces of 3,3,3,3,4: the second global
        # batch straddles a piece) trains the same weights as whole batches through train_epochs
        batches = [rl_batch(vocab, seed=1), rl_batch(vocab, seed=2)]
        runs = {}
        for name, pieces in (("whole", None), ("resizer", pieces_of(concat_batches(batches), [3, 3, 3, 3, 4]))):
            group.build("fsdp").wait(timeout=120)
            metrics = group.rl_updates(batches, pieces).wait(timeout=120)
            runs[name] = metrics, group.weights().wait(timeout=120)[0]  # a collective: every rank
        # the first global batch is bit-identical; the second (cut from pieces of other widths) whitens
        # over narrower tensors, which changes fp32 rounding (measured: weights within 6e-8)
        (resized, resized_w), (whole, whole_w) = runs["resizer"], runs["whole"]
        assert len(resized[0]) == 2 and resized[0][0] == whole[0][0] and resized[1][0] == whole[1][0]
        for rank in (0, 1):
            assert resized[rank][1] == {k: pytest.approx(v, rel=1e-5) for k, v in whole[rank][1].items()}
        init = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
        assert any(not torch.equal(w, init[name]) for name, w in whole_w.items())  # it trained
        for name, w in whole_w.items():
            torch.testing.assert_close(resized_w[name], w, rtol=1e-5, atol=1e-6)
        if importlib.util.find_spec("megatron") is None:
            return
        group.build("megatron").wait(timeout=120)  # DP=2
        valid = batch["attention_mask"][:, 1:].bool()
        for rank, (padded, packed) in enumerate(group.logprobs(batch).wait(timeout=120)):
            rows = slice(rank, None, 2)
            torch.testing.assert_close(padded[valid[rows]], ref_logprobs[rows][valid[rows]], rtol=0, atol=1e-5)
            torch.testing.assert_close(packed[valid[rows]], ref_logprobs[rows][valid[rows]], rtol=0, atol=1e-5)
        for metrics in group.train(batch).wait(timeout=120):
            assert metrics["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
    finally:
        group.shutdown()


def test_batch_resizer_gathers_global_batches_from_a_channel_then_splits_by_tokens(cluster):
    from rlinf_like.runtime import Channel
    from rlinf_like.training.batch_resizer import BatchResizer

    full = rl_batch()
    pieces = [{k: v[i:i + 3, :max(LENGTHS[i:i + 3]) + 1 if v.shape[1] == WIDTH else max(LENGTHS[i:i + 3])]
               if v.dim() == 2 else v[i:i + 3] for k, v in full.items()} for i in (0, 3)]  # 3 + 3 rows, own widths
    pieces.append({k: v[6:] for k, v in full.items()})
    channel = Channel.create("resizer-test", item_type=dict)
    for piece in pieces:
        channel.put(piece)
    channel.close()
    seen = []

    def whiten(batch):  # a hook sees the whole global batch
        seen.append(batch)
        adv = batch["advantages"]
        return {**batch, "advantages": (adv - adv.mean()) * batch["response_mask"]}

    loop = LoopConfig(max_tokens_per_micro_batch=30, pack_sequences=True)
    steps = list(BatchResizer(channel, global_rows=7, hooks=[whiten], rank=0, world_size=2, loop=loop))
    assert len(seen) == 1 and len(steps) == 1  # 8 rows: one global batch of 7, the last row held back
    width = seen[0]["input_ids"].shape[1]
    torch.testing.assert_close(seen[0]["input_ids"], full["input_ids"][:7, :width])
    ranks = [list(BatchResizer(pieces, 7, [whiten], rank=r, world_size=2, loop=loop))[0] for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 2  # 91 tokens over 2 ranks x 30: two micro-batches each
    assert sum(scale for rank in ranks for _, scale in rank) == pytest.approx(2.0)  # shares x world size
    assert all("packing" in micro and micro["packing"].tokens <= 30 for rank in ranks for micro, _ in rank)
    channel.destroy()


def test_the_actor_and_critic_receive_the_loop_section_as_written():
    """`actor.loop` is the `LoopConfig` the trainers get; the run adds only its seed and memory budget."""
    from rlinf_like.runners.reasoning.actor_setup import actor_config
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    cfg = ReasoningConfig()
    cfg.actor.loop.epochs, cfg.actor.loop.micro_batch_size, cfg.runner.seed = 3, 5, 7
    built = actor_config(cfg, "model", micro_batch_tokens=4096)
    assert built.loop is cfg.actor.loop
    assert (built.loop_terms.seed, built.loop_terms.micro_batch_tokens) == (7, 4096)
