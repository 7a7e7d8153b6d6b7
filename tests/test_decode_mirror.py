"""The decode mirror (dense keys/values of a stable batch, kept across steps) reads exactly what the per-step gather
of the paged cache reads: same tokens and logprobs, bit for bit, through admissions, finishes and block growth."""

import pytest
import torch

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native.mirror import DecodeMirror

MAX_NEW = [30, 3, 21, 40, 9, 26]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("mirror"), TinyModelSpec(arch="llama")))


def requests():
    gen = torch.Generator().manual_seed(0)
    return [RolloutRequest(f"r{i}", torch.randint(4, 100, (5 + 7 * i,), generator=gen).tolist(),
                           SamplingParams(max_new_tokens=m, temperature=1.0, ignore_eos=True, seed=i), 2)
            for i, m in enumerate(MAX_NEW)]


def test_mirrored_decode_equals_the_gathered_one(model_path, monkeypatch):
    # 8 slots for 12 samples: later requests are admitted as earlier ones finish; blocks of 4 tokens grow often
    def generate():
        engine = make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=8, kv_block_size=4))
        return [(r.response_ids, r.logprobs) for r in engine.generate(requests())]

    builds, reuses, ready = [], [], DecodeMirror.ready

    def counted(self, key, *args):
        before = self.k
        used = ready(self, key, *args)
        (reuses if used and self.k is before else builds).append(used)
        return used

    monkeypatch.setattr(DecodeMirror, "ready", counted)
    mirrored = generate()
    assert all(builds) and len(reuses) > 3 * len(builds)  # the mirror was used, and mostly kept
    monkeypatch.setattr(DecodeMirror, "ready", lambda self, *args: False)  # every step gathers from the blocks
    assert generate() == mirrored
    assert [len(ids[0]) for ids, _ in mirrored] == MAX_NEW


def test_the_mirror_is_not_built_past_its_memory_limit_and_is_dropped_after_the_loop(model_path, monkeypatch):
    engine = make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=8, kv_block_size=4))
    seen = []
    ready = DecodeMirror.ready

    def limited(self, key, positions, width, k_cache, v_cache, table, block_size, limit_bytes):
        seen.append(ready(self, key, positions, width, k_cache, v_cache, table, block_size, 1024))
        return seen[-1]

    monkeypatch.setattr(DecodeMirror, "ready", limited)
    engine.generate(requests()[:2])
    assert seen and not any(seen)
    assert engine.decoder.mirror.k is None
