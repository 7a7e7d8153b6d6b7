"""MegatronModelManager on CPU over gloo, in real Ray worker groups: TP=2, PP=2 and DP=2 (distributed
optimizer) train exactly like FSDP and an unsharded reference on the same HF weights and data;
offload/onload is bit-exact; weights reshard into native rollout engines (tp=1, tp=2) exactly;
checkpoints resume identically and the HF export reloads with the same logprobs."""

import importlib.util

import pytest
import torch

from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.lr_schedule import SchedulerConfig, lr_multiplier
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs, token_nll_loss
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runtime import Worker, connect_groups, wait_all

# a spec lookup, not an import: the rollout workers unpickle this module and need no megatron
pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")

SPEC = TinyModelSpec(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     init_std=0.05)
VOCAB, SEQ = 100, 12
LENGTHS = [12, 9, 12, 7] * 2  # each data-parallel half holds the same number of tokens
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.0, clip_grad=1.0)
SCHED = SchedulerConfig("cosine", warmup_steps=1, total_steps=20)


def global_batch(step):
    """Learnable rows: each token is the previous one + 3 (mod 96), from a random start."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, 96, (len(LENGTHS), 1), generator=g)
    ids = (start + 3 * torch.arange(SEQ)) % 96 + 4
    mask = (torch.arange(SEQ)[None] < torch.tensor(LENGTHS)[:, None]).long()
    return {"input_ids": ids * mask, "attention_mask": mask}


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


class Trainer(Worker):
    def __init__(self, path):
        self.path, self.manager, self.senders = path, None, {}

    def set_path(self, path):
        self.path = path

    def build(self, backend, **config):
        from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager

        if hasattr(self.manager, "close"):
            self.manager.close()
        if backend == "fsdp":
            self.manager = FSDPModelManager(hf_model(self.path), FSDPConfig(optim=OPTIM, scheduler=SCHED))
            self.dp = (self.rank, self.world_size)
        else:
            self.manager = MegatronModelManager(self.path, MegatronConfig(optim=OPTIM, scheduler=SCHED, **config))
            self.dp = (self.manager.dp_rank, self.manager.dp_size)

    def train(self, steps, start=0, calls=1):
        """`calls` > 1: the caller accumulates over several forward_backward calls, syncing on the last."""
        out = []
        for step in range(start, start + steps):
            batch, (rank, size) = global_batch(step), self.dp
            per = batch["input_ids"].shape[0] // size
            local = {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}
            rows, losses = per // calls, []
            for i in range(calls):
                micro = {k: v[i * rows:(i + 1) * rows] for k, v in local.items()}
                m = self.manager.forward_backward(micro, loss_scale=1 / calls, sync_gradients=i == calls - 1)
                losses.append(m["loss"])
            o = self.manager.optim_step()
            out.append((sum(losses) / calls, o["grad_norm"], o["lr"]))
        return out

    def state(self):
        """This rank's params, main grads and optimizer state (copies)."""
        from rlinf_like.hybrid_engines.residency import PARTS

        return {part: [t.clone() for t in self.manager.residency._tensors(part)] for part in PARTS}

    def offload_cycle(self):
        self.manager.offload()
        off = self.manager.get_status()
        self.manager.onload()
        return off.offloaded, off.device_bytes, self.manager.get_status().device_bytes

    def layouts(self):
        return self.manager.shard_layouts()

    def sync_setup(self, name, plan):
        from rlinf_like.hybrid_engines.reshard import WeightSender

        self.senders[name] = WeightSender(self.peer_group(name), plan, self.rank)

    def publish(self, name, version):
        return self.senders[name].publish(version, self.manager.named_shards())

    def full_hf(self):
        from rlinf_like.hybrid_engines.megatron.checkpoint import gather_hf

        return gather_hf(self.manager)

    def save(self, path):
        self.manager.save(path)

    def load(self, path):
        self.manager.load(path)

    def export(self, path):
        self.manager.export_hf(path)

    def logprobs(self, batch, temperature=1.0):
        return self.manager.compute_logprobs(batch, temperature)


class Rollout(Worker):
    """A native rollout engine (tp = this group's size), as the rollout worker holds it."""

    def __init__(self, path):
        from rlinf_like.workers.rollout.engine import RolloutConfig, make_engine

        group = self.process_group if self.world_size > 1 else None
        self.engine = make_engine(RolloutConfig(model_path=path, max_batch_size=2, dtype="float32"), group)

    def layouts(self):
        return self.engine.weight_layouts()

    def connect(self, name, plan):
        self.engine.connect_weights(self.peer_group(name), plan, self.rank)

    def apply(self, version):
        return self.engine.apply_weights(version)

    def weights(self):
        return {n: t.clone() for n, t in self.engine.weight_tensors().items()}


@pytest.fixture(scope="module")
def setup(cluster, tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("mg") / "qwen2", SPEC))
    # one placement for every group of this module, so that their shares of the 2 CPU slots add up
    placement = cluster.place({"mg_actor": "0-1", "mg_rollout1": "0", "mg_rollout2": "0-1", "mg_actor4": "0-1*2"})
    actor = Trainer.create_group(path).launch(cluster, placement, "mg_actor")
    yield actor, placement, path
    actor.shutdown()


def reference(path, steps):
    model = hf_model(path)
    opt = torch.optim.AdamW(model.parameters(), lr=OPTIM.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_multiplier(SCHED))
    out = []
    for step in range(steps):
        loss, _ = token_nll_loss(model, global_batch(step))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM.clip_grad)
        out.append((loss.item(), norm.item(), opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
        opt.zero_grad()
    return out


def run(actor, backend, steps=3, calls=1, **config):
    actor.build(backend, **config).wait(timeout=120)
    per_rank = actor.train(steps, calls=calls).wait(timeout=120)
    # (mean loss over the ranks, grad norm, lr): data-parallel ranks hold equal token counts, TP/PP
    # ranks report the same loss
    n = len(per_rank)
    return [(sum(r[s][0] for r in per_rank) / n, per_rank[0][s][1], per_rank[0][s][2]) for s in range(steps)]


def assert_matches(ref, runs):
    for name, got in runs.items():
        for step in range(len(ref)):
            assert got[step][0] == pytest.approx(ref[step][0], rel=1e-5), (name, step)
            assert got[step][1] == pytest.approx(ref[step][1], rel=1e-4), (name, step)
            assert got[step][2] == pytest.approx(ref[step][2]), (name, step)


def test_tp2_pp2_dp2_train_like_fsdp_and_an_unsharded_reference(setup):
    actor, _, path = setup
    ref = reference(path, 3)
    runs = {
        "fsdp dp2": run(actor, "fsdp"),
        "megatron tp2": run(actor, "megatron", tensor_parallel=2),
        "megatron pp2 x 2 micro-batches": run(actor, "megatron", pipeline_parallel=2, micro_batches=2),
        "megatron dp2 distributed optimizer": run(actor, "megatron", distributed_optimizer=True),
        # the caller accumulates two half batches (unsynced, then synced) per step, as with FSDP
        "megatron tp2, 2 accumulated calls": run(actor, "megatron", calls=2, tensor_parallel=2),
    }
    assert ref[2][0] < ref[0][0] - 0.05  # the model learns: the comparison is not between constants
    assert_matches(ref, runs)


def test_tied_embeddings_across_pipeline_stages(setup, tmp_path):
    """Llama with tied embeddings, PP=2: the last stage's output layer is megatron's copy of the first
    stage's embedding, kept equal by its embedding-group gradient reduction."""
    actor, _, _ = setup
    tied = str(write_tiny_model(tmp_path / "tied", TinyModelSpec(
        arch="llama", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        tie_word_embeddings=True, init_std=0.05)))
    actor.set_path(tied).wait()
    try:
        got = run(actor, "megatron", steps=3, pipeline_parallel=2, micro_batches=2)
    finally:
        actor.set_path(setup[2]).wait()
    assert_matches(reference(tied, 3), {"megatron pp2, tied embeddings": got})


def test_tp2_x_pp2_on_four_ranks_matches_the_reference(setup, cluster):
    _, placement, path = setup
    group = Trainer.create_group(path).launch(cluster, placement, "mg_actor4")
    try:
        got = run(group, "megatron", steps=2, tensor_parallel=2, pipeline_parallel=2, micro_batches=2)
    finally:
        group.shutdown()
    assert_matches(reference(path, 2), {"megatron tp2 x pp2": got})


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_offload_onload_is_bit_exact_and_training_continues_identically(setup, precision):
    """Distributed optimizer over DP=2: params in megatron's contiguous buffer, grads in its grad
    buffer (main_grad), Adam state (and under bf16 the fp32 main copies) sharded over the ranks."""
    actor, _, _ = setup
    config = dict(distributed_optimizer=True, precision=precision)
    actor.build("megatron", **config).wait(timeout=120)
    actor.train(2).wait()
    before = actor.state().wait()
    off, device_bytes, back = actor.offload_cycle().wait()[0]
    assert off == {"params": True, "grads": True, "optimizer": True} and set(device_bytes.values()) == {0}
    assert all(n > 0 for n in back.values())
    after = actor.state().wait()
    for rank in range(2):
        for part, tensors in before[rank].items():
            assert tensors and all(torch.equal(a, b) for a, b in zip(tensors, after[rank][part])), part
    continued = actor.train(2, start=2).wait()
    continued_params = actor.state().wait()[0]["params"]
    actor.build("megatron", **config).wait(timeout=120)
    straight = actor.train(4).wait()
    assert [r[2:] for r in straight] == continued  # bit-identical losses, grad norms, lrs
    assert all(torch.equal(a, b) for a, b in zip(continued_params, actor.state().wait()[0]["params"]))


def assert_rollout_holds(rollout, full):
    [layouts] = rollout.on_ranks(0).layouts().wait()
    shards = rollout.weights().wait()
    for layout in layouts:
        for rank, box in enumerate(layout.boxes):
            expected = full[layout.name][tuple(slice(lo, hi) for lo, hi in box)]
            assert torch.equal(shards[rank][layout.name], expected), (layout.name, rank)


def test_megatron_tp2_and_pp2_weights_sync_exactly_into_native_rollouts(setup, cluster):
    from rlinf_like.hybrid_engines.reshard import SyncPlan

    actor, placement, path = setup
    rollouts = {tp: Rollout.create_group(path).launch(cluster, placement, f"mg_rollout{tp}") for tp in (1, 2)}
    try:
        for tp, rollout in rollouts.items():
            connect_groups(actor, rollout, f"mg_w{tp}")
        version = 0
        for config in ({"tensor_parallel": 2}, {"pipeline_parallel": 2}):
            actor.build("megatron", **config).wait(timeout=120)
            actor.train(2).wait()  # the rollouts still hold the checkpoint: a sync must change them
            [src] = actor.on_ranks(0).layouts().wait()
            full = actor.full_hf().wait()[0]
            for tp, rollout in rollouts.items():
                [dst] = rollout.on_ranks(0).layouts().wait()
                plan = SyncPlan.build(src, dst, actor.name, rollout.name, bucket_bytes=16 << 10)
                wait_all([actor.sync_setup(f"mg_w{tp}", plan), rollout.connect(f"mg_w{tp}", plan)])
                version += 1
                wait_all([actor.publish(f"mg_w{tp}", version), rollout.apply(version)], timeout=60)
                assert_rollout_holds(rollout, full)
    finally:
        for rollout in rollouts.values():
            rollout.shutdown()


def test_checkpoint_resumes_identically_reshards_and_hf_export_reloads(setup, tmp_path):
    actor, _, _ = setup
    actor.build("megatron", tensor_parallel=2).wait(timeout=120)
    actor.train(2).wait()
    actor.save(str(tmp_path / "ckpt")).wait()
    first = actor.train(2, start=2).wait()
    actor.load(str(tmp_path / "ckpt")).wait()
    assert actor.train(2, start=2).wait() == first
    # the same checkpoint loads into another layout (megatron reshards model and Adam state)
    actor.build("megatron", pipeline_parallel=2, micro_batches=2).wait(timeout=120)
    actor.load(str(tmp_path / "ckpt")).wait()
    resharded = actor.train(2, start=2).wait()
    for step in range(2):
        assert resharded[0][step][0] == pytest.approx(first[0][step][0], rel=1e-5)
        assert resharded[0][step][1:] == pytest.approx(first[0][step][1:], rel=1e-4)
    # the distributed optimizer (Adam state sharded over DP=2) resumes identically too
    actor.build("megatron", distributed_optimizer=True).wait(timeout=120)
    actor.train(2).wait()
    actor.save(str(tmp_path / "ckpt_dp")).wait()
    dp_next = actor.train(2, start=2).wait()
    actor.load(str(tmp_path / "ckpt_dp")).wait()
    assert actor.train(2, start=2).wait() == dp_next

    actor.export(str(tmp_path / "hf")).wait()
    batch = global_batch(99)
    exported = token_logprobs(hf_model(str(tmp_path / "hf")), batch, temperature=0.7).detach()
    got = actor.logprobs(batch, 0.7).wait()
    mask = batch["attention_mask"][:, 1:].bool()
    torch.testing.assert_close(got[0][mask], exported[mask], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0], got[1])
