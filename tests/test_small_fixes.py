"""Small fixes, each checked where it broke: run-scoped channel names, an embodied actor on several
ranks (every rank gets the whole trajectory set), and micro_batch_size=None (one pass) in the
reference model and the reward model (the critic's: tests/test_critic_warmup.py)."""

import copy

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.data.trajectory import Trajectory, ppo_batch
from rlinf_like.envs import ActionSpec, FieldSpec
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs
from rlinf_like.models.policies import PolicyConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.embodied.runner import check_actor_split, trajectory_channel
from rlinf_like.runners.embodied.config import EmbodiedConfig
from rlinf_like.runtime import Channel
from rlinf_like.runtime.placement import Device
from rlinf_like.runtime.worker import WorkerContext
from rlinf_like.workers.actor.ppo import EmbodiedActorWorker, PPOConfig
from rlinf_like.workers.inference.worker import InferenceWorker
from rlinf_like.workers.reward.combine import check_reward_config
from rlinf_like.workers.reward.rules import RewardConfig


# --- 1. the trajectory channel is named for the run ----------------------------------------------------------
def test_trajectory_channels_of_two_runs_on_one_ray_do_not_collide(cluster):
    other_run = copy.copy(cluster)  # a second driver on the same Ray: same namespace, its own run_id
    other_run.run_id = "0therrun"
    first, second = trajectory_channel(cluster), trajectory_channel(other_run)
    try:
        assert first.name == f"trajectories-{cluster.run_id}" and second.name == "trajectories-0therrun"
        with pytest.raises(ValueError, match="already exists"):  # the name is what keeps them apart
            trajectory_channel(cluster)
    finally:
        first.destroy()
        second.destroy()


def test_trajectory_channel_is_running_when_the_run_gets_it(cluster):
    """The store actor's process starts before the run's clock (it cost the first update ~5 s when it started
    in the background): an actor still starting would not answer within the second."""
    import ray

    channel = trajectory_channel(cluster)
    try:
        ready, _ = ray.wait([channel._store.__ray_ready__.remote()], timeout=1.0)
        assert ready, "the channel's store actor was still starting"
    finally:
        channel.destroy()


# --- 2. an embodied actor on several ranks --------------------------------------------------------------------
def toy_trajectories(ranks=2, steps=8, envs=2, seed=0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(ranks):
        rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        dones = torch.rand(steps, envs, generator=g) < 0.2
        out.append(Trajectory(obs={"state": rand(steps, envs, 4)},
                              actions=torch.randint(0, 2, (steps, envs), generator=g),
                              logprobs=rand(steps, envs).clamp(max=0) - 0.7, values=rand(steps, envs),
                              rewards=rand(steps, envs), dones=dones, bootstrap=rand(steps, envs), version=1, rank=r))
    return out


def chunks_of(traj: Trajectory, cut: int) -> list[Trajectory]:
    def part(s: slice) -> Trajectory:
        return Trajectory(obs={"state": traj.obs["state"][s]}, actions=traj.actions[s], logprobs=traj.logprobs[s],
                          values=traj.values[s], rewards=traj.rewards[s], dones=traj.dones[s],
                          bootstrap=traj.bootstrap[s], version=traj.version, rank=traj.rank)

    first, last = part(slice(0, cut)), part(slice(cut, None))
    first.final, last.start = False, cut
    return [first, last]


def test_every_embodied_actor_rank_trains_on_the_whole_trajectory_set(cluster, tmp_path):
    ppo, gamma = PPOConfig(epochs=2, mini_batches=2), 0.99
    actor = EmbodiedActorWorker.create_group(
        PolicyConfig(hidden=[16]), {"state": FieldSpec((4,), "float32")}, ActionSpec("discrete", (), n=2), ppo, gamma,
        FSDPConfig(optim=OptimConfig(lr=1e-2)), 0).launch(cluster, cluster.place({"emb_actor": "0-1"}), "emb_actor")
    channel = Channel.create(cluster.scoped_name("test-trajectories"), Trajectory)
    trajs = toy_trajectories()
    advantages = ppo_batch(trajs, gamma, ppo.lam)["advantages"]  # the whole set's rows
    try:
        actor.save(str(tmp_path / "start")).wait(timeout=60)
        # reference: each rank handed the whole set directly
        given = actor.train(trajectories=trajs).wait(timeout=60)
        weights = actor.full_state().wait(timeout=60)[0]  # a collective: every rank
        runs = {"whole": [trajs[1], trajs[0]],  # arrival order does not matter
                "streamed": [c for pair in zip(chunks_of(trajs[0], 3), chunks_of(trajs[1], 5)) for c in pair]}
        for how, items in runs.items():
            actor.load(str(tmp_path / "start")).wait(timeout=60)
            for item in items:
                channel.put(item)
            # before: rank 0 took every item and rank 1 waited for ever (or each rank trained on part of the set)
            metrics = actor.train(channel=channel.name, count=2, streamed=how == "streamed").wait(timeout=60)
            for rank_metrics, reference in zip(metrics, given):
                assert rank_metrics["advantage_mean"] == pytest.approx(float(advantages.mean()), abs=1e-6), how
                assert rank_metrics["policy_loss"] == reference["policy_loss"], how  # the same rows, bit for bit
                assert rank_metrics["trajectory_chunks"] == len(items), how
            after = actor.full_state().wait(timeout=60)[0]  # a collective: every rank
            for name, w in weights.items():
                assert torch.equal(after[name], w), (how, name)
            assert channel.qsize() == 0, how  # rank 0 forwarded every item and each rank took its copies
    finally:
        channel.destroy()
        actor.shutdown()


def test_embodied_actor_ranks_must_split_the_update_evenly():
    cfg = EmbodiedConfig()
    cfg.runner.steps_per_rollout, cfg.env.num_envs, cfg.algorithm.ppo.mini_batches = 10, 3, 4  # 30 rows per env rank
    check_actor_split(cfg, actor_ranks=1, env_ranks=1)  # one rank: uneven mini-batches are fine
    check_actor_split(cfg, actor_ranks=2, env_ranks=4)  # 120 rows = 2 x 4 x 15
    with pytest.raises(ValueError, match=r"= 30 rows per update do not divide by the actor ranks in "
                                         r"cluster.component_placement.actor \(2\) x algorithm.ppo.mini_batches \(4\)"):
        check_actor_split(cfg, actor_ranks=2, env_ranks=1)


# --- 3, 4. micro_batch_size=None: the whole shard in one pass ----------------------------------------------
def in_process(cls, rank: int, world_size: int, *args):
    """A worker built in this process the way its Ray host builds it (its context, then `__init__`),
    for a worker that needs no process group: no worker process to start."""
    worker = cls.__new__(cls)
    worker._ctx = WorkerContext(cls.__name__, rank, world_size, Device("cpu", rank, 0, "local", "127.0.0.1"), 60.0)
    worker.__init__(*args)
    return worker


def test_reference_micro_batch_size_none_scores_each_shard_in_one_pass(tmp_path):
    # (the critic's compute_values with micro_batch_size=None runs in tests/test_critic_warmup.py)
    from transformers import AutoModelForCausalLM

    path = write_tiny_model(tmp_path / "model", TinyModelSpec(init_std=0.02))
    prompts = [[5, 9, 14], [30, 31, 32, 33], [8, 40], [17, 18, 19], [22, 23]]
    responses = [[7, 8], [9], [41, 42, 43], [20, 21], [24, 25, 26]]
    batch = build_rl_batch(prompts, responses, [[0.0] * len(r) for r in responses], [0.0] * 5)
    # before: range() arg 3 must not be None
    parts = [in_process(InferenceWorker, rank, 2, str(path), None).compute_logprobs(batch) for rank in range(2)]
    assert [p.shape[0] for p in parts] == [2, 3]  # each rank its own rows
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        expected = token_logprobs(lm, batch, 1.0)
    torch.testing.assert_close(torch.cat(parts), expected, rtol=1e-5, atol=1e-5)


def test_reward_model_micro_batch_size_none_is_one_pass(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from rlinf_like.workers.reward.model import RewardModel

    base = write_tiny_model(tmp_path / "base", TinyModelSpec(init_std=0.2))
    torch.manual_seed(3)
    AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32).save_pretrained(
        tmp_path / "rm")
    rows = [[5, 9, 14, 22, 7], [30, 31], [8, 8, 40, 41, 42, 43, 44, 9], [17, 3]]
    one_pass = RewardModel(str(tmp_path / "rm"), micro_batch_size=None).score(rows)  # before: range step None
    in_pieces = RewardModel(str(tmp_path / "rm"), micro_batch_size=2).score(rows)
    assert one_pass.shape == (4,) and one_pass.std() > 1e-3
    torch.testing.assert_close(one_pass, in_pieces, rtol=1e-5, atol=1e-5)
    assert RewardModel(str(tmp_path / "rm"), micro_batch_size=None).score([]).shape == (0,)
    check_reward_config(RewardConfig(kind="model", model_path="rm", model_micro_batch_size=None))
    with pytest.raises(ValueError, match="reward.model_micro_batch_size must be > 0 or null"):
        check_reward_config(RewardConfig(kind="model", model_path="rm", model_micro_batch_size=0))
