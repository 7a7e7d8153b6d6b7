"""EngineClient (`workers/rollout/engines/engine_client.py`): requests from many threads into one native engine's serve
loop, the owner's between-steps hook, closing, and failures that reach every waiter."""

import threading

import pytest

from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.engine_client import EngineClient

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def engine(model_path):
    return make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=8, kv_cache_memory_gb=0.05))


def requests(model_path, count=12):
    tok = load_tokenizer(model_path)
    return [RolloutRequest(f"r{i}", tok(f"prompt {i} " * (1 + i % 3)).input_ids, GREEDY) for i in range(count)]


def test_requests_from_many_threads_get_what_generate_gives(engine, model_path):
    reqs = requests(model_path)
    expected = {r.request_id: r.response_ids for r in engine.generate(reqs)}
    steps = []
    with EngineClient(engine) as client:
        client.between_steps = lambda: steps.append(1)
        futures = {}
        threads = [threading.Thread(target=lambda r=r: futures.__setitem__(r.request_id, client.submit(r)))
                   for r in reqs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        got = {key: future.result(timeout=30).response_ids for key, future in futures.items()}
        with pytest.raises(ValueError, match="request 'r0' is already in flight"):
            client.submit(reqs[0])
            client.submit(reqs[0])
    assert got == expected
    assert len(steps) >= 24  # the hook ran before every decode step (24 tokens each, 12 requests in 8 slots)
    with pytest.raises(RuntimeError, match="submit after close"):
        client.submit(reqs[1])
    assert not any(t.name == "engine-client" and t.is_alive() for t in threading.enumerate())


def test_close_with_abort_returns_unfinished_samples_partial(engine, model_path):
    long = RolloutRequest("long", requests(model_path, 1)[0].prompt_ids, SamplingParams(max_new_tokens=10_000,
                                                                                         temperature=0.0, ignore_eos=True))
    client = EngineClient(engine)
    started = threading.Event()
    client.between_steps = started.set
    future = client.submit(long)
    started.wait(10)
    client.close(abort=True)
    result = future.result(timeout=10)
    assert result.finish_reasons == ["abort"] and 0 < len(result.response_ids[0]) < 10_000


def test_an_engine_error_fails_every_pending_future(engine, model_path):
    reqs = requests(model_path, 4)
    gate = threading.Event()

    def fail_once_all_are_in():
        gate.wait(10)
        raise RuntimeError("weight sync lost its peer")

    with EngineClient(engine) as client:
        client.between_steps = fail_once_all_are_in
        futures = [client.submit(r) for r in reqs]
        gate.set()
        for future in futures:
            with pytest.raises(RuntimeError, match="weight sync lost its peer"):
                future.result(timeout=10)
        later = client.submit(reqs[0])
        with pytest.raises(RuntimeError, match="weight sync lost its peer"):
            later.result(timeout=1)
    engine.offload()  # an engine that cannot serve at all: the first request hears why
    try:
        with EngineClient(engine) as client:
            with pytest.raises(RuntimeError, match=r"serve\(\) while offloaded"):
                client.submit(reqs[0]).result(timeout=10)
    finally:
        engine.onload()


def test_engines_that_do_not_serve_continuously_are_refused_by_name(model_path):
    hf = make_engine(RolloutConfig(engine="hf", model_path=model_path))
    with pytest.raises(ValueError, match=r"rollout.engine in \['native'.*\]\); HFEngine does not"):
        EngineClient(hf)
