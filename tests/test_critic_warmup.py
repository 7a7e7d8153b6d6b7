"""Critic warmup: during the first `critic.warmup_steps` steps only the value model
trains. Real actor and critic worker groups driven by the runner's own update step, in process (one rank each: the
subject is the update step, not the process boundary)."""

import pytest
import torch
from safetensors.torch import load_file

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.config import AlgorithmConfig, CriticSection, ReasoningConfig, RunnerConfig
from rlinf_like.runners.reasoning.worker_set import Workers
from rlinf_like.runners.reasoning.phases import update
from rlinf_like.runners.reasoning import check_config
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker
from rlinf_like.workers.critic import CriticConfig, CriticWorker
from rlinf_like.training.loop import LoopConfig

WARMUP = 3


def toy_batch(rows=4):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 60, (4,), generator=g).tolist() for _ in range(rows)]
    responses = [torch.randint(4, 60, (3,), generator=g).tolist() for _ in range(rows)]
    batch = build_rl_batch(prompts, responses, [[-2.0] * 3] * rows, [1.0, -1.0] * (rows // 2))
    batch["returns"] = torch.tensor([1.0, -1.0] * (rows // 2)).unsqueeze(1) * batch["response_mask"]
    return batch


@pytest.fixture()
def runner_with_workers(tmp_path):
    from rlinf_like.runtime import Cluster, ClusterConfig

    with Cluster(ClusterConfig(backend="local", num_cpus=1)) as cluster:
        path = write_tiny_model(tmp_path / "model", TinyModelSpec(init_std=0.02))
        loop = LoopConfig(mini_batches=1, micro_batch_size=None, epochs=2)  # None: the 4 rows in one pass
        placement = cluster.place({"actor": "0", "critic": "0"})
        actor = ActorWorker.create_group(ActorConfig(model_path=str(path), fsdp=FSDPConfig(optim=OptimConfig(lr=1e-2)), loop=loop)).launch(
            cluster, placement, "actor")
        critic = CriticWorker.create_group(CriticConfig(model_path=str(path), fsdp=FSDPConfig(optim=OptimConfig(lr=3e-3, clip_grad=None)),
                                                        loop=loop, value_clip=None)).launch(cluster, placement, "critic")
        cfg = ReasoningConfig(algorithm=AlgorithmConfig(advantage="gae"), critic=CriticSection(warmup_steps=WARMUP),
                              runner=RunnerConfig(output_dir=str(tmp_path / "run")))
        check_config(cfg)
        workers = Workers(placement=placement, actor=actor, actor_dp=actor.data_parallel().wait(timeout=60),
                          rollout=None, reward=None, critic=critic, collocated=False)
        yield (cfg, workers), path, tmp_path
        actor.shutdown()
        critic.shutdown()


def actor_weights(runner, path):
    _, workers = runner
    workers.actor.export_hf(str(path)).wait(timeout=120)
    return load_file(str(path / "model.safetensors"))


def test_warmup_trains_the_critic_only_then_the_actor(runner_with_workers):
    runner, model_path, tmp = runner_with_workers
    init = load_file(str(model_path / "model.safetensors"))
    batch = toy_batch()
    cfg, workers = runner
    batch["old_values"] = torch.cat(workers.critic.compute_values(batch).wait(timeout=120))
    losses = []
    for step in range(WARMUP):
        metrics = update(workers, cfg, batch, step)
        assert metrics["critic_warmup"] == 1.0 and "policy_loss" not in metrics
        losses.append(metrics["value_loss"])
    assert losses[-1] < 0.7 * losses[0], losses  # the value model learns the fixed returns
    during = actor_weights(runner, tmp / "after_warmup")
    assert during.keys() == init.keys() and all(torch.equal(during[k], init[k]) for k in init)  # bit-identical

    metrics = update(workers, cfg, batch, WARMUP)  # warmup over: the policy trains
    assert metrics["critic_warmup"] == 0.0 and "policy_loss" in metrics and "value_loss" in metrics
    after = actor_weights(runner, tmp / "after_update")
    assert any(not torch.equal(after[k], init[k]) for k in init)


def test_warmup_needs_a_critic(tmp_path):
    cfg = ReasoningConfig(critic=CriticSection(warmup_steps=2), runner=RunnerConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"critic.warmup_steps=2 .* only algorithm.advantage=gae launches"):
        check_config(cfg)
