"""FSDPModelManager on a tiny HF Llama across two gloo ranks, against an unsharded reference."""

import contextlib
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.lr_schedule import SchedulerConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs, token_nll_loss
from rlinf_like.runtime import Cluster, ClusterConfig, Worker
from rlinf_like.training.loop import run_steps

VOCAB, SEQ, GLOBAL_BATCH = 64, 12, 8


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float()


def global_batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def shard(batch, rank, world):
    per = batch["input_ids"].shape[0] // world
    return {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}


CONFIG = FSDPConfig(optim=OptimConfig(lr=1e-2, weight_decay=0.0, clip_grad=1.0),
                    scheduler=SchedulerConfig("cosine", warmup_steps=1, total_steps=20))


class Trainer(Worker):
    def __init__(self, lean=False):
        self.manager = FSDPModelManager(tiny_llama(), replace(CONFIG, lean=lean))

    def holds_gathered(self):
        return self.manager.hold_gathered

    def train(self, steps, micro_batches=1, start=0):
        out = []
        for step in range(start, start + steps):
            local = shard(global_batch(step), self.rank, self.world_size)
            per = local["input_ids"].shape[0] // micro_batches
            losses = []
            for i in range(micro_batches):
                micro = {k: v[i * per:(i + 1) * per] for k, v in local.items()}
                m = self.manager.forward_backward(micro, loss_scale=1 / micro_batches,
                                                  sync_gradients=i == micro_batches - 1)
                losses.append(m["loss"])
            metrics = self.manager.optim_step()
            out.append((sum(losses) / micro_batches, metrics["grad_norm"], metrics["lr"]))
        return out

    def logprobs(self, batch):
        return self.manager.compute_logprobs(batch)

    def train_autocast(self, window: bool, steps=2, micro_batches=4):
        """Fresh bf16 (CPU autocast) training through the one training loop, `accumulating` on or off: this rank's
        weights after `steps` optimizer steps of `micro_batches` each, and how many bf16 copies of the weights
        were made."""
        manager = FSDPModelManager(tiny_llama(), replace(CONFIG, precision="bf16", lean=self.manager.config.lean))
        if not window:
            manager.accumulating = contextlib.nullcontext
        plan = [[(shard(shard(global_batch(step), self.rank, self.world_size), i, micro_batches), 1 / micro_batches)
                 for i in range(micro_batches)] for step in range(steps)]
        with CastCounter(list(manager.model.parameters())) as counter:
            run_steps(manager, plan, token_nll_loss)
        local = lambda p: p.to_local() if hasattr(p, "to_local") else p  # an FSDP rank's shard
        return {n: local(p).detach().clone() for n, p in manager.model.named_parameters()}, counter.casts

    def full_params(self):
        return {n: p.full_tensor() for n, p in self.manager.model.named_parameters()}

    def save(self, path):
        self.manager.save(path)

    def load(self, path):
        self.manager.load(path)

    def export(self, path):
        self.manager.export_hf(path)

    def offload_status(self):
        self.manager.offload()
        off = self.manager.get_status()
        self.manager.onload()
        return off.offloaded, off.device_bytes, self.manager.get_status().offloaded, self.manager.get_config()


class CastCounter(TorchDispatchMode):
    """Counts the bf16 copies made of weights (autocast's casts reach the dispatcher as `_to_copy`)."""

    def __init__(self, tensors):
        super().__init__()
        self.shapes, self.casts = {t.shape for t in tensors}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16 \
                and isinstance(args[0], torch.nn.Parameter) and args[0].shape in self.shapes:
            self.casts += 1
        return func(*args, **kwargs)


WEIGHTS = 2 * 4 + 2 * 3 + 1  # per layer the 4 attention and 3 MLP projections, and the output layer: what autocast casts


def assert_cast_once_a_step(trainer, casts_in_window: int) -> None:
    """2 steps of 4 micro-batches, `accumulating` off and on: every weight cast once a micro-batch, then
    `casts_in_window` times a step, and the same weights bit for bit."""
    off, on = trainer.train_autocast(window=False).wait(), trainer.train_autocast(window=True).wait()
    for (weights, casts), (windowed, casts_windowed) in zip(off, on):
        assert all(torch.equal(weights[n], windowed[n]) for n in weights)
        assert (casts, casts_windowed) == (2 * 4 * WEIGHTS, 2 * casts_in_window * WEIGHTS)


def test_a_steps_micro_batches_cast_the_weights_to_bf16_once_with_the_same_gradients():
    """One unsharded rank (in process): one cast a step."""
    with Cluster(ClusterConfig(backend="local", num_cpus=1)) as local:
        assert_cast_once_a_step(Trainer.create_group().launch(local, local.place({"t": "0"}), "t"), 1)


@pytest.fixture()
def trainers(cluster):
    placement = cluster.place({"trainer": "0-1"})
    group = Trainer.create_group().launch(cluster, placement, "trainer")
    yield group
    group.shutdown()


def reference_run(steps):
    """The same training, unsharded, in this process, on the whole global batch."""
    from rlinf_like.hybrid_engines.lr_schedule import lr_multiplier

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)  # torch's default is 0.01
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(CONFIG.scheduler))
    out = []
    for step in range(steps):
        loss, _ = token_nll_loss(model, global_batch(step))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        out.append((loss.item(), norm.item(), opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, out


def test_dp2_training_matches_unsharded_reference_and_accumulation(trainers, tmp_path):
    ref_model, ref = reference_run(4)
    got = trainers.train(4).wait(timeout=120)
    for step in range(4):
        mean_loss = (got[0][step][0] + got[1][step][0]) / 2  # equal token counts per rank
        assert mean_loss == pytest.approx(ref[step][0], rel=1e-6)
        assert got[0][step][1] == pytest.approx(ref[step][1], rel=1e-6)  # global grad norm, same on both ranks
        assert got[0][step][2] == got[1][step][2] == pytest.approx(ref[step][2])  # warmup then cosine
    params = trainers.full_params().wait()[0]
    for name, p in ref_model.named_parameters():
        torch.testing.assert_close(params[name], p.detach(), rtol=1e-4, atol=1e-5)

    # resume: save after 4 steps, run 2 more, reload, run them again -> identical
    trainers.save(str(tmp_path / "ckpt")).wait()
    first = trainers.train(2, start=4).wait()
    trainers.load(str(tmp_path / "ckpt")).wait()
    again = trainers.train(2, start=4).wait()
    assert first == again
    trainers.save(str(tmp_path / "ckpt")).wait()  # overwriting leaves exactly one checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("lean", [False, True])
def test_accumulation_equals_one_big_micro_batch(cluster, lean):
    """Held gathered weights and unsharded gradients accumulated over the micro-batches (the CPU default), or
    (`lean`, for a model the memory share cannot hold) gathered and reduce-scattered per micro-batch: the same
    training."""
    placement = cluster.place({"a": "0-1"})
    group = Trainer.create_group(lean).launch(cluster, placement, "a")
    try:
        assert group.holds_gathered().wait() == [not lean] * 2
        group.train(3, micro_batches=2).wait(timeout=120)
        accumulated = group.full_params().wait()[0]
        # under CPU bf16 autocast, held: the first 3 micro-batches share one cast and the last casts afresh, with
        # the same training bit for bit (see FSDPModelManager.accumulating); lean: a cast per micro-batch
        assert_cast_once_a_step(group, 4 if lean else 2)
    finally:
        group.shutdown()
    ref_model, _ = reference_run(3)
    for name, p in ref_model.named_parameters():
        torch.testing.assert_close(accumulated[name], p.detach(), rtol=1e-4, atol=1e-5)


def test_logprobs_export_and_residency(trainers, tmp_path):
    batch = global_batch(99)
    ref = token_logprobs(tiny_llama(), batch).detach()
    lp = trainers.logprobs(batch).wait()
    assert lp[0].shape == (GLOBAL_BATCH, SEQ - 1)
    torch.testing.assert_close(lp[0], ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(lp[0], lp[1])

    trainers.train(1).wait()
    trainers.export(str(tmp_path / "hf")).wait()
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    torch.testing.assert_close(token_logprobs(reloaded, batch).detach(), trainers.logprobs(batch).wait()[0],
                               rtol=1e-5, atol=1e-5)

    off, device_bytes, back, config = trainers.offload_status().wait()[0]
    assert off == {"params": True, "grads": True, "optimizer": True} and set(device_bytes.values()) == {0}
    assert back == {"params": False, "grads": False, "optimizer": False}
    assert config["backend"] == "fsdp2" and config["world_size"] == 2 and config["optim"]["lr"] == 1e-2


def policy_loss(model, batch):
    """An embodied-style loss on a plain module: regress actions from observations."""
    pred = model(batch["obs"])
    loss = (pred - batch["action"]).pow(2).mean()
    return loss, {"abs_err": (pred - batch["action"]).abs().mean().item()}


def policy_batch(step, rank=None, world=2):
    g = torch.Generator().manual_seed(step)
    obs = torch.randn(8, 6, generator=g)
    batch = {"obs": obs, "action": obs[:, :3].tanh()}
    return batch if rank is None else {k: v[rank * 4:(rank + 1) * 4] for k, v in batch.items()}


def tiny_policy():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class PolicyTrainer(Worker):
    def __init__(self):
        self.manager = FSDPModelManager(tiny_policy(), FSDPConfig(optim=OptimConfig(lr=1e-2, clip_grad=None)))

    def train(self, steps):
        out = []
        for step in range(steps):
            out.append(self.manager.forward_backward(policy_batch(step, self.rank), policy_loss)["loss"])
            self.manager.optim_step()
        return out

    def sync_setup(self, plan):
        from rlinf_like.hybrid_engines.reshard import WeightSender

        self.sender = WeightSender(self.peer_group("w"), plan, self.rank)

    def layouts(self):
        return self.manager.shard_layouts()

    def publish(self, version):
        return self.sender.publish(version, self.manager.named_shards())

    def full_params(self):
        return {n: p.full_tensor() for n, p in self.manager.model.named_parameters()}


class PolicyRollout(Worker):
    def __init__(self):
        self.tensors = {n: torch.zeros_like(p) for n, p in tiny_policy().named_parameters()}

    def sync_setup(self, plan):
        from rlinf_like.hybrid_engines.reshard import WeightReceiver

        self.receiver = WeightReceiver(self.peer_group("w"), plan, self.rank, self.tensors)

    def apply(self, version):
        self.receiver.apply(version)
        return self.tensors


def test_plain_module_with_custom_loss_trains_and_syncs_to_a_rollout(cluster):
    from rlinf_like.hybrid_engines.reshard import SyncPlan, replicated
    from rlinf_like.runtime import connect_groups, wait_all

    placement = cluster.place({"policy": "0-1", "policy_rollout": "0"})
    actor = PolicyTrainer.create_group().launch(cluster, placement, "policy")
    rollout = PolicyRollout.create_group().launch(cluster, placement, "policy_rollout")
    try:
        losses = actor.train(5).wait(timeout=120)
        reference = tiny_policy()
        opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0)
        for step in range(5):
            loss, _ = policy_loss(reference, policy_batch(step))
            assert (losses[0][step] + losses[1][step]) / 2 == pytest.approx(loss.item(), rel=1e-6)
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert losses[0][-1] < losses[0][0]

        connect_groups(actor, rollout, "w")
        [layouts] = actor.on_ranks(0).layouts().wait()
        targets = [replicated(l.name, l.shape, 1, l.dtype) for l in layouts]
        plan = SyncPlan.build(layouts, targets, "policy", "policy_rollout")
        wait_all([actor.sync_setup(plan), rollout.sync_setup(plan)])
        _, [weights] = wait_all([actor.publish(1), rollout.apply(1)])
        full = actor.full_params().wait()[0]
        assert weights.keys() == full.keys()
        for name in full:
            assert torch.equal(weights[name], full[name]), name
            torch.testing.assert_close(full[name], dict(reference.named_parameters())[name].detach(),
                                       rtol=1e-5, atol=1e-6)
    finally:
        actor.shutdown()
        rollout.shutdown()
