"""EmbodiedActorWorker: PPO actor-critic on the FSDPModelManager (a plain torch policy module).

Per update: GAE(gamma, lambda) over the trajectories' episode segments (`data.trajectory`), then
`epochs` passes of `mini_batches` shuffled mini-batches, one optimizer step each, through the
training loop every trained role shares (`training/loop.py`). The loss is the
shared algorithms: clipped surrogate (`policy_loss`), clipped value loss (`value_loss`), minus an
entropy bonus; advantages are normalized per mini-batch (`masked_whiten`).
With `streamed=True` it takes trajectory chunks as the rollout ranks put them (`StreamedGAE`: the
GAE of each finished episode while collection goes on) until every rank's final chunk is in; the
batch (rows in rollout-rank order, as without streaming) is then the same, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlinf_like.config.validate import bounded
from rlinf_like.algorithms.advantage_estimators.grpo import GRPOOptions
from rlinf_like.algorithms import PolicyLossConfig, build_estimator, masked_whiten, policy_loss, value_loss
from rlinf_like.data.episode_groups import episode_group_advantages
from rlinf_like.data.batch import Batch
from rlinf_like.data.trajectory import StreamedGAE, Trajectory, rows_batch, trajectory_gae
from rlinf_like.envs import ActionSpec, FieldSpec
from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.models.policies import PolicyConfig, build_policy
from rlinf_like.runtime import Channel
from rlinf_like.workers.trained import TrainedWorker
from rlinf_like.training.loop import LoopConfig, LoopTerms, train_epochs

FORWARD_KEY = "actor-rank-"  # channel key of the items rank 0 forwards to actor rank r (`_feed`)


@dataclass(kw_only=True)
class PPOConfig:
    """The keys only embodied PPO reads (`algorithm.ppo`); the discount and the optimizer's are the algorithm's."""

    lam: float = bounded(0.95, ge=0, le=1)  # GAE lambda
    clip: float = bounded(0.2, ge=0)  # PPO ratio clip: 1 +- clip
    value_clip: float | None = None  # clipped value loss around the rollout's values; None: plain MSE
    vf_coef: float = 0.5  # value loss weight
    ent_coef: float = 0.0  # entropy bonus weight
    normalize_advantages: bool = True  # whiten advantages per mini-batch
    epochs: int = bounded(10, gt=0)  # passes over each update's batch
    mini_batches: int = bounded(4, gt=0)  # optimizer steps per epoch
    max_grad_norm: float = bounded(0.5, gt=0)  # gradients are clipped to this global norm
    # a name in ADVANTAGE_ESTIMATORS that declares `embodied` (gae | grpo | rloo); grpo and rloo compare the
    # returns of algorithm.ppo.group_size episodes started from the same state (reset with the same seed)
    advantage: str = "gae"
    group_size: int = bounded(4, gt=1)  # grpo / rloo: episodes per group (consecutive envs of a stage)
    grpo: GRPOOptions = field(default_factory=GRPOOptions)  # algorithm.ppo.advantage=grpo: its options


def ppo_loss(cfg: PPOConfig):
    clip = PolicyLossConfig(clip_low=cfg.clip, clip_high=cfg.clip, dual_clip=None, aggregation="token-mean")

    def loss(model, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        _, logprobs, entropy, values = model({k: batch[k] for k in model.obs_keys}, batch["actions"])
        mask = batch["mask"] if "mask" in batch else torch.ones_like(logprobs)  # grouped: each env's first episode
        adv = masked_whiten(batch["advantages"], mask) if cfg.normalize_advantages else batch["advantages"]
        pg, metrics = policy_loss(logprobs, batch["old_logprobs"], adv, mask, clip)
        vf = value_loss(values, batch["old_values"], batch["returns"], mask, cfg.value_clip)
        ent = entropy.mean()
        total = pg + cfg.vf_coef * vf - cfg.ent_coef * ent
        return total, {"policy_loss": pg.item(), "value_loss": vf.item(), "entropy": ent.item(), **metrics}

    return loss


class EmbodiedActorWorker(TrainedWorker):
    def __init__(self, policy: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec,
                 ppo: PPOConfig, gamma: float, fsdp: FSDPConfig, seed: int = 0):
        torch.manual_seed(seed)  # every rank builds the same initial weights
        self.ppo, self.gamma, self.seed = ppo, gamma, seed
        self.manager = FSDPModelManager(build_policy(policy, obs_spec, action), fsdp)
        self._loss = ppo_loss(ppo)

    def train(self, trajectories: list[Trajectory] | None = None, channel: str | None = None,
              count: int = 0, streamed: bool = False) -> dict[str, float]:
        """One PPO update on the given trajectories, or on `count` rollout ranks' taken from `channel`
        (whole, or as streamed chunks). Every rank trains on its own rows of the whole batch."""
        if streamed:
            items, chunks = self._streamed(self._feed(channel), count)
        else:
            if trajectories is None:
                take = self._feed(channel)
                trajectories = [take() for _ in range(count)]
            trajectories = sorted(trajectories, key=lambda t: t.rank)  # rows in rank order, whatever came first
            if self.ppo.advantage != "gae":
                return self._train_grouped(trajectories)
            items, chunks = [(t, *trajectory_gae(t, self.gamma, self.ppo.lam)) for t in trajectories], len(trajectories)
        return self._train_rows(rows_batch(items), chunks)

    def _train_grouped(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Group-relative advantages of each env's first episode (`data/episode_groups.py`); the rest masked."""
        estimator = build_estimator(self.ppo.advantage, self.ppo)
        items, masks, returns = [], [], []
        for t in trajectories:
            adv, ret, mask = episode_group_advantages(t.rewards, t.dones, self.ppo.group_size, estimator)
            items.append((t, adv, t.values.float()))  # no critic target: the value head is not trained on it
            masks.append(mask.reshape(-1))
            returns.append(ret)
        batch = rows_batch(items)
        batch["mask"] = torch.cat(masks)
        out = self._train_rows(batch, len(trajectories))
        out["group_return_mean"] = float(torch.cat(returns).mean())
        return out

    def _train_rows(self, batch: dict[str, torch.Tensor], chunks: int) -> dict[str, float]:
        loop = LoopConfig(mini_batches=self.ppo.mini_batches, micro_batch_size=None, epochs=self.ppo.epochs)
        out = train_epochs(self.manager, batch, self._loss, self.rank, self.world_size, loop,  # a mini-batch a pass
                           terms=LoopTerms(seed=self.seed))
        returns, values = batch["returns"], batch["old_values"]
        out["explained_variance"] = float(1 - (returns - values).var() / returns.var().clamp(min=1e-8))
        out["advantage_mean"] = float(batch["advantages"].mean())
        out["trajectory_chunks"] = chunks
        return out

    def _feed(self, name: str) -> Callable[[], Trajectory]:
        """The next item of channel `name` for this rank. Every rank needs every item, but a channel
        hands each item to one consumer: rank 0 takes the rollout's items and forwards each to the
        other ranks' keys (a blocking channel get, not a collective that would time out during a long
        collect)."""
        channel = Channel.connect(name)
        if self.rank:
            return lambda: channel.get(key=f"{FORWARD_KEY}{self.rank}")

        def take() -> Trajectory:
            item = channel.get()
            for rank in range(1, self.world_size):
                channel.put(item, key=f"{FORWARD_KEY}{rank}")
            return item

        return take

    def _streamed(self, take: Callable[[], Trajectory], ranks: int) -> tuple[list, int]:
        """Chunks as they come, GAE per finished episode, until `ranks` rollout ranks sent their last one."""
        per_rank: dict[int, StreamedGAE] = {}
        chunks = 0
        while sum(g.complete for g in per_rank.values()) < ranks:
            chunk = take()
            per_rank.setdefault(chunk.rank, StreamedGAE(self.gamma, self.ppo.lam)).add(chunk)
            chunks += 1
        return [per_rank[r].result() for r in sorted(per_rank)], chunks

    def full_state(self) -> dict[str, torch.Tensor]:
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in self.manager.model.named_parameters()}
