"""Residency on FSDP2-sharded (DTensor) params, grads and Adam state across two gloo ranks."""

import torch
from torch import nn

from rlinf_like.hybrid_engines import PARTS, ResidencyManager
from rlinf_like.runtime import Worker


class FSDPTrainer(Worker):
    def run(self, steps: int, offload_every_step: bool):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)  # same initial weights on both ranks, then sharded
        model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16))
        mesh = init_device_mesh("cpu", (self.world_size,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        res = ResidencyManager(model, opt)
        losses, freed = [], []
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + self.rank)  # each rank its own data
            x = torch.randn(8, 16, generator=g)
            loss = (model(x) - x.flip(-1)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            losses.append(loss.item())
            if offload_every_step:
                res.offload()
                freed.append(all(res.device_bytes(p) == 0 for p in PARTS))
                res.onload()
        full = {n: p.full_tensor() for n, p in model.named_parameters()}
        return losses, freed, {n: t.sum().item() for n, t in full.items()}, type(model[0].weight).__name__


def test_fsdp2_training_with_offload_matches_training_without(cluster):
    placement = cluster.place({"trainer": "0-1"})
    group = FSDPTrainer.create_group().launch(cluster, placement, "trainer")
    try:
        plain = group.run(5, False).wait(timeout=120)
        offloaded = group.run(5, True).wait(timeout=120)
    finally:
        group.shutdown()
    for rank in range(2):
        losses_a, _, sums_a, param_type = plain[rank]
        losses_b, freed, sums_b, _ = offloaded[rank]
        assert param_type == "DTensor"
        assert losses_a == losses_b  # bit-identical training
        assert sums_a == sums_b
        assert freed == [True] * 5
    assert plain[0][0] != plain[1][0]  # ranks saw different data, so the check is not vacuous
