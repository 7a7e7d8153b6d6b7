"""ElasticActorWorker: an actor whose data-parallel size may change at optimizer-step boundaries.

Used by the dynamic collocated schedule (`runners/reasoning/schedules/dynamic.py`): while the rollout's last
replicas are still generating, the actor trains on the devices already given back, and grows as
more are freed. Two rules make the result independent of how many ranks train a step:

1. Work is cut into `blocks` fixed by the batch, not by the ranks: a mini-batch's rows split into
   `world_size` contiguous blocks, each micro-batched the same way (loss scale 1 / micro-batches of
   the block). A step on k ranks gives each rank a contiguous run of blocks.
2. The gradient is reduced exactly: every block's gradient is kept apart, gathered over the
   active ranks, and summed in block order, then divided by the number of blocks. The same floats
   are added in the same order whether one rank or all of them computed the blocks, so weights are
   bit-identical to a step taken at full size (on CPU; on GPU given deterministic kernels).

Every rank holds the whole model and optimizer (FSDP2 over a one-rank mesh: data parallel, not
sharded; memory as DDP). A rank that joins mid-step first takes the model, optimizer, LR schedule
and step counter from an active rank by broadcast ("reshard" for a replicated layout). Process
groups for every subset of ranks are made eagerly at construction (so at most `MAX_RANKS` ranks).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from rlinf_like.data.batch import Batch, shard_rows
from rlinf_like.hybrid_engines.fsdp import FSDPModelManager
from rlinf_like.hybrid_engines.model_manager import token_nll_loss
from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.reshard.layout import replicated
from rlinf_like.hybrid_engines.tensors import local_tensor
from rlinf_like.workers.actor.loss import rl_loss
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker
from rlinf_like.training.loop import micro_batches, micro_rows

MAX_RANKS = 4  # 2^n - n - 1 subset groups are made eagerly


def block_owners(num_blocks: int, active: list[int]) -> dict[int, list[int]]:
    """Active rank -> the contiguous run of blocks it computes (sizes differ by at most one)."""
    runs = torch.arange(num_blocks).tensor_split(len(active))
    return {rank: run.tolist() for rank, run in zip(active, runs)}


class ElasticActorWorker(ActorWorker):
    def __init__(self, config: ActorConfig):
        from transformers import AutoModelForCausalLM

        if self.world_size > MAX_RANKS:
            raise ValueError(f"runner.schedule=dynamic: the actor has {self.world_size} ranks; the elastic actor "
                             f"supports at most {MAX_RANKS} (one process group per subset of ranks)")
        torch.manual_seed(config.loop_terms.seed)
        self.config = config
        singles = [dist.new_group([r]) for r in range(self.world_size)]  # collective: every rank, same order
        self._subsets = {ranks: dist.new_group(list(ranks)) for n in range(2, self.world_size + 1)
                         for ranks in itertools.combinations(range(self.world_size), n)}
        mesh = DeviceMesh.from_group(singles[self.rank], torch.device(self.torch_device).type)
        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
        self.manager = FSDPModelManager(model, config.fsdp, mesh=mesh)
        self._loss = rl_loss(config.loss, config.loss_terms)
        self._params = list(self.manager.model.parameters())
        self._materialize_optimizer_state()

    def _materialize_optimizer_state(self) -> None:
        """AdamW creates its state at the first step; a rank that joins must have the same tensors to
        receive into. A zero-LR step on zero gradients creates them without moving any weight, then
        they are zeroed: exactly the state a first real step starts from."""
        groups = self.manager.optimizer.param_groups
        lrs = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = 0.0
        for p in self._params:
            p.grad = torch.zeros_like(p)
        self.manager.optimizer.step()
        for g, lr in zip(groups, lrs):
            g["lr"] = lr
        for state in self.manager.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
        self.manager.clear_gradients()

    # --- weights to the rollout: every rank holds every tensor whole ----------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        return [replicated(name, tuple(p.shape), self.world_size, str(p.dtype))
                for name, p in self.manager.named_shards().items()]

    # --- scale-sync: a joining rank takes the current state -------------------------------------------
    def _group(self, ranks: list[int]):
        return self._subsets[tuple(sorted(ranks))]

    @torch.no_grad()
    def join(self, source: int, joining: list[int]) -> None:
        """Collective over `source` and `joining`: copy model, optimizer state, LR schedule and step
        from `source` into the joining ranks, in place (tensor objects stay, so residency keeps working)."""
        group = self._group([source, *joining])
        for p in self._params:
            dist.broadcast(local_tensor(p), src=source, group=group)
            state = self.manager.optimizer.state[p]
            for key in sorted(state):
                if isinstance(state[key], torch.Tensor):
                    dist.broadcast(local_tensor(state[key]), src=source, group=group)
        m = self.manager
        meta = [{"step": m.step, "scheduler": m.scheduler.state_dict(),
                 "lrs": [g["lr"] for g in m.optimizer.param_groups]}]
        dist.broadcast_object_list(meta, src=source, group=group)
        if self.rank != source:
            m.step = meta[0]["step"]
            m.scheduler.load_state_dict(meta[0]["scheduler"])
            for g, lr in zip(m.optimizer.param_groups, meta[0]["lrs"]):
                g["lr"] = lr

    # --- one optimizer step on the active ranks --------------------------------------------------------
    def _block_gradient(self, block: Batch, loss_fn) -> tuple[list[torch.Tensor], dict[str, float]]:
        micros = micro_batches(block, micro_rows(block, self.config.loop, self.config.loop_terms.micro_batch_tokens))
        metrics: dict[str, float] = {}
        for micro in micros:
            for k, v in self.manager.forward_backward(micro, loss_fn, loss_scale=1 / len(micros)).items():
                metrics[k] = metrics.get(k, 0.0) + v / len(micros)
        grads = [local_tensor(p.grad).clone() if p.grad is not None else torch.zeros_like(local_tensor(p))
                 for p in self._params]
        self.manager.clear_gradients()
        return grads, metrics

    @torch.no_grad()
    def _reduce_exactly(self, mine: list[list[torch.Tensor]], owners: dict[int, list[int]]) -> None:
        """Sum every block's gradient in block order over the active ranks; set it as each param's grad."""
        active, num_blocks = sorted(owners), sum(len(b) for b in owners.values())
        most = max(len(b) for b in owners.values())
        group = self._group(active) if len(active) > 1 else None
        for i, p in enumerate(self._params):
            local = torch.stack([g[i] for g in mine])
            if group is None:
                blocks = list(local)
            else:
                padded = torch.zeros((most, *local.shape[1:]), dtype=local.dtype, device=local.device)
                padded[: len(mine)] = local
                gathered = [torch.empty_like(padded) for _ in active]
                dist.all_gather(gathered, padded, group=group)
                blocks = [row for rank, part in zip(active, gathered) for row in part[: len(owners[rank])]]
            total = blocks[0].clone()
            for block in blocks[1:]:
                total += block
            total /= num_blocks
            p.grad = DTensor.from_local(total, p.device_mesh, p.placements) if isinstance(p, DTensor) else total

    def train_minibatch(self, batch: Batch, active: list[int], sft: bool = False) -> dict:
        """One optimizer step on `batch` (a whole mini-batch) over the `active` ranks (this one among
        them). Returns {"blocks": [(block, metrics)], **optim metrics}; the caller averages blocks."""
        owners = block_owners(self.world_size, sorted(active))
        loss_fn = token_nll_loss if sft else self._loss
        grads, metrics = [], []
        for b in owners[self.rank]:
            g, m = self._block_gradient(shard_rows(batch, b, self.world_size), loss_fn)
            grads.append(g)
            metrics.append((b, m))
        self._reduce_exactly(grads, owners)
        return {"blocks": metrics, **self.manager.optim_step()}

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """SFT warm-start: the whole batch as one mini-batch on every rank (all of them are active)."""
        out = self.train_minibatch(batch, list(range(self.world_size)), sft=True)
        return {**mean_block_metrics([out]), **{k: v for k, v in out.items() if k != "blocks"}}


def mean_block_metrics(outs: list[dict]) -> dict[str, float]:
    """Per-block metrics of one optimizer step (every active rank's answer), averaged in block order:
    the same numbers whichever ranks computed which blocks."""
    blocks = sorted((b, m) for out in outs for b, m in out["blocks"])
    return {k: sum(m[k] for _, m in blocks) / len(blocks) for k in blocks[0][1]}
