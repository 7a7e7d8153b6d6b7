"""fp16 with a gradient scaler: the scaler logic on CPU (torch.amp.GradScaler("cpu") works in torch
2.13), and FSDPModelManager(precision="fp16") on two gloo ranks, where an overflow must make both
ranks skip the step and halve the scale together (ShardedGradScaler)."""

import pytest
import torch

from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.grad_scaling import backward, make_grad_scaler, optimizer_step
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_nll_loss
from rlinf_like.runtime import Worker


def test_scaler_skips_inf_steps_and_lowers_the_scale_then_steps_on_finite_grads():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler("fp16", torch.device("cpu"), init_scale=1024.0)
    assert make_grad_scaler("bf16", torch.device("cpu")) is None
    start = [p.detach().clone() for p in model.parameters()]

    backward(model(torch.ones(2, 3)).sum(), scaler)
    assert float(model.bias.grad) == 2 * 1024.0  # the loss was scaled
    model.weight.grad[0, 0] = float("inf")
    norm, skipped = optimizer_step(optimizer, model.parameters(), 1e9, scaler)
    assert skipped and norm == float("inf") and scaler.get_scale() == 512.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), start))  # no update
    optimizer.zero_grad()

    backward(model(torch.ones(2, 3)).sum(), scaler)
    norm, skipped = optimizer_step(optimizer, model.parameters(), 1e9, scaler)
    assert not skipped and norm == pytest.approx(float(torch.tensor([2.0] * 4).norm()))  # unscaled grads
    torch.testing.assert_close(model.bias.detach(), start[1] - 0.1 * 2.0)  # plain SGD step on true grads
    assert scaler.get_scale() == 512.0  # grows only after growth_interval clean steps


class Fp16Trainer(Worker):
    def __init__(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        self.manager = FSDPModelManager(LlamaForCausalLM(cfg).float(),
                                        FSDPConfig(precision="fp16", optim=OptimConfig(lr=1e-2)))

    def step(self, overflow: bool):
        ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(self.rank))
        def loss_fn(model, batch):  # an overflow on one rank only: the scaler must agree across ranks
            loss, metrics = token_nll_loss(model, batch)
            return (loss * float("inf") if overflow and self.rank == 1 else loss), metrics
        before = {n: p.full_tensor().clone() for n, p in self.manager.model.named_parameters()}
        metrics = self.manager.forward_backward({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, loss_fn)
        metrics.update(self.manager.optim_step())
        changed = any(not torch.equal(p.full_tensor(), before[n]) for n, p in self.manager.model.named_parameters())
        return metrics, changed


@pytest.mark.extended
def test_fsdp_fp16_manager_skips_overflow_on_every_rank(cluster):
    group = Fp16Trainer.create_group().launch(cluster, cluster.place({"fp16": "0-1"}), "fp16")
    try:
        first = group.step(overflow=False).wait(timeout=120)
        for metrics, changed in first:
            assert changed and metrics["skipped"] == 0.0 and metrics["grad_scale"] == 2.0**16
        over = group.step(overflow=True).wait(timeout=120)
        for metrics, changed in over:  # both ranks: no update, scale halved
            assert not changed and metrics["skipped"] == 1.0 and metrics["grad_scale"] == 2.0**15
        after = group.step(overflow=False).wait(timeout=120)
        assert all(changed and m["skipped"] == 0.0 for m, changed in after)
    finally:
        group.shutdown()


def _fp16_on_gpu(port, results):
    import datetime

    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    manager = FSDPModelManager(LlamaForCausalLM(cfg).float(), FSDPConfig(precision="fp16", optim=OptimConfig(lr=3e-3)))
    ids = (torch.arange(32)[None] * 3 + torch.arange(8)[:, None]) % 128
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    losses, metrics = [], []
    for _ in range(30):
        losses.append(manager.forward_backward(batch)["loss"])
        metrics.append(manager.optim_step())
    results.put({"losses": losses, "skipped": sum(m["skipped"] for m in metrics),
                 "scale": metrics[-1]["grad_scale"], "master": str(next(manager.model.parameters()).dtype)})
    dist.destroy_process_group()


@pytest.mark.gpu
def test_fsdp_fp16_trains_on_gpu():
    """Not yet run: no GPU was lent to this task. fp16 compute, fp32 master weights, loss goes down."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_fp16_on_gpu, args=(port, results))
    proc.start()
    out = results.get(timeout=300)
    proc.join(60)
    assert out["master"] == "torch.float32"
    assert out["losses"][-1] < 0.5 * out["losses"][0]
    assert out["skipped"] <= 3 and 1.0 <= out["scale"] <= 2.0**16
