"""Collocated turns on CPU move nothing: the trainers' and the rollout's offload/onload verbs leave every storage (and
the native engine's KV cache) where it is, because the device memory is the host memory an offload would copy into.
`force=True` still moves, so the mechanism stays reachable through the same verbs."""

import logging

import pytest
import torch

from rlinf_like.hybrid_engines import residency
from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runtime import Cluster, ClusterConfig
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams
from rlinf_like.workers.rollout.worker import RolloutWorker
from rlinf_like.workers.trained import TrainedWorker


class Trainer(TrainedWorker):
    def __init__(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64)).float()
        self.manager = FSDPModelManager(model, FSDPConfig(optim=OptimConfig(lr=1e-2)))
        ids = torch.randint(0, 64, (2, 8))
        self.manager.forward_backward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        self.manager.optim_step()  # grads and optimizer state exist: every part has storages

    def pointers(self) -> list[int]:
        r = self.manager.residency
        return [s.data_ptr() for part in residency.PARTS for s in r._storages(part).values()]

    def offloaded(self) -> dict[str, bool]:
        return self.manager.get_status().offloaded


class Rollout(RolloutWorker):
    def kv_cache(self) -> tuple[int, int, int] | None:
        """The KV cache tensor's identity and address, and the prefix pool's identity (None: no cache)."""
        k = self.engine.decoder.k_cache
        return None if k is None else (id(k), k.data_ptr(), id(self.engine._pool))


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama")))
    with Cluster(ClusterConfig(backend="local", num_cpus=2)) as cluster:
        placement = cluster.place({"actor": "0", "rollout": "0"})
        actor = Trainer.create_group().launch(cluster, placement, "actor")
        rollout = Rollout.create_group(RolloutConfig(model_path=path, max_batch_size=2,
                                                     kv_cache_memory_gb=0.01)).launch(cluster, placement, "rollout")
        yield actor, rollout


def test_a_cpu_trainer_turn_moves_nothing_unless_forced(groups):
    actor, _ = groups
    before = actor.pointers().wait()[0]
    moved = actor.offload().wait()
    assert actor.pointers().wait()[0] == before
    assert actor.offloaded().wait()[0] == {"params": False, "grads": False, "optimizer": False}
    assert moved == [0] and actor.onload().wait() == [0]

    moved = actor.offload(force=True).wait()[0]  # the mechanism is still there when asked for
    assert moved > 0 and actor.offloaded().wait()[0] == {"params": True, "grads": True, "optimizer": True}
    assert actor.onload().wait() == [moved]
    assert actor.offloaded().wait()[0] == {"params": False, "grads": False, "optimizer": False}


def test_a_cpu_rollout_turn_keeps_its_kv_cache_across_steps(groups, caplog, monkeypatch):
    _, rollout = groups
    monkeypatch.setattr(residency, "_said_why", False)
    request = RolloutRequest("q", [1, 2, 3, 4], SamplingParams(max_new_tokens=4, temperature=0.0))
    first = rollout.generate([request]).wait()[0]
    cache = rollout.kv_cache().wait()[0]
    assert cache is not None
    with caplog.at_level(logging.INFO, logger=residency.__name__):
        moved = rollout.offload().wait() + rollout.offload().wait()
    assert rollout.kv_cache().wait()[0] == cache
    assert moved == [False, False]
    assert [r.getMessage() for r in caplog.records].count(residency.CPU_STAYS) == 1  # the run's log says why, once
    rollout.onload().wait()
    assert rollout.kv_cache().wait()[0] == cache  # no re-allocation; the prefix cache's pool is kept too
    assert rollout.generate([request]).wait()[0][0].response_ids == first[0].response_ids

    assert rollout.offload(force=True).wait() == [True]
    assert rollout.kv_cache().wait()[0] is None
    rollout.onload().wait()
    assert rollout.generate([request]).wait()[0][0].response_ids == first[0].response_ids
