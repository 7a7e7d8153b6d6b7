"""The Tinker-compatible server (`python -m rlinf_like.tinker serve`) driven by the real `tinker` 0.38 client, in
this process on a tiny model: the routes a LoRA training client and a sampling client call, Tinker's losses,
ordering and retries by seq_id, chunked forward_backward, a save/load round trip, and the refusals."""

import contextlib
import math
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from rlinf_like.runtime import Cluster, ClusterConfig  # noqa: E402
from rlinf_like.tinker import losses  # noqa: E402
from rlinf_like.tinker.server import TinkerServer  # noqa: E402
from rlinf_like.tinker.service import TinkerService, served_names  # noqa: E402

TOKENS = [5, 6, 7, 8, 9, 10, 11, 12]


@contextlib.contextmanager
def serving(cluster, path: str, out, **options):
    """A server for the model at `path` on `cluster`, in this process, closed on leaving."""
    srv = TinkerServer(TinkerService(path, served_names(path), out, cluster), **options)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("model"), TinyModelSpec(seed=3)))
    with Cluster(ClusterConfig(backend="local", num_cpus=1)) as cluster, \
            serving(cluster, path, tmp_path_factory.mktemp("out"),
                    client_config={"fwdbwd_max_chunk_len": 2}) as srv:  # 3+ data go in chunks
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with tinker.ServiceClient(base_url=server.base_url, api_key="tml-test") as service:
        yield service, service.create_lora_training_client(base_model=server.service.model_path, rank=4).result()


def datum(tokens, weights=None):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)})


def reference_logprobs(folder: str, tokens: list[int]) -> list[float]:
    """log p(tokens[i] | tokens[:i]) from transformers on an exported checkpoint, in fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()


def test_a_lora_client_trains_samples_and_its_logprobs_match_a_reference_forward(client, server):
    service, training = client
    greedy = types.SamplingParams(max_tokens=5, temperature=0.0)
    prompt = types.ModelInput.from_ints(TOKENS[:3])
    base = service.create_sampling_client(base_model=server.service.model_path).result()
    before = base.sample(prompt, 1, greedy).result().sequences[0].tokens
    losses_seen = []
    for _ in range(8):  # a fixed target: the continuation TOKENS[3:]
        result = training.forward_backward([datum(TOKENS)], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        losses_seen.append(result.metrics["loss:sum"])
    assert losses_seen[-1] < 0.2 * losses_seen[0], losses_seen  # summed over 7 tokens, not averaged
    logprobs = result.loss_fn_outputs[0]["logprobs"].data
    assert len(logprobs) == len(TOKENS) - 1
    assert losses_seen[-1] == pytest.approx(-sum(logprobs), rel=1e-5)
    sampler = training.save_weights_and_get_sampling_client().result()
    after = sampler.sample(prompt, 2, greedy).result()
    assert [s.tokens for s in after.sequences] == [TOKENS[3:8]] * 2 and before != TOKENS[3:8]
    assert after.sequences[0].stop_reason == "length" and len(after.sequences[0].logprobs) == 5
    # the sampler's prompt logprobs (`compute_logprobs`; its weights came from the actor in memory) equal
    # transformers' forward on the same weights exported by a named save
    path = training.save_weights_for_sampler("exported").result().path
    folder = server.service.sampler_paths[path]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], reference_logprobs(folder, TOKENS), rtol=1e-5, atol=1e-5)


def test_a_sampler_a_step_merges_the_steps_adapters_on_the_oldest_sessions_engine(client, server, monkeypatch):
    from rlinf_like.tinker.service import MAX_SAMPLERS

    _, training = client
    samplers = server.service.samplers
    for _ in range(MAX_SAMPLERS):  # every open session now one of these steps'
        training.save_weights_and_get_sampling_client().result()
    oldest_id, oldest = next(iter(samplers.items()))
    monkeypatch.setattr(server.service, "_new_engine", lambda folder: pytest.fail("a new engine was built"))
    training.forward_backward([datum(TOKENS)], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    assert oldest_id not in samplers and list(samplers.values())[-1] is oldest  # its engine, reused
    assert len(samplers) == MAX_SAMPLERS
    # the reused engine serves the step's weights: its prompt logprobs equal transformers' on their export
    folder = server.service.sampler_paths[training.save_weights_for_sampler("after-step").result().path]
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    np.testing.assert_allclose(scored[1:], reference_logprobs(folder, TOKENS), rtol=1e-5, atol=1e-5)


def test_chunked_forward_backward_sums_like_one_call_and_a_retried_seq_id_applies_once(client):
    _, training = client
    data = [datum(TOKENS[i:i + 5]) for i in range(3)]  # chunks of 2 and 1 (fwdbwd_max_chunk_len=2)
    chunked = training.forward(data, "cross_entropy").result()
    singles = [training.forward([d], "cross_entropy").result() for d in data]
    assert [len(o["logprobs"].data) for o in chunked.loss_fn_outputs] == [4, 4, 4]
    assert chunked.metrics["loss:sum"] == pytest.approx(sum(s.metrics["loss:sum"] for s in singles), rel=1e-5)
    for whole, single in zip(chunked.loss_fn_outputs, singles):
        np.testing.assert_allclose(whole["logprobs"].data, single.loss_fn_outputs[0]["logprobs"].data, rtol=1e-5)


def test_a_retry_of_the_same_seq_id_gets_the_first_posts_request(client, server):
    _, training = client
    model = server.service.models[training.model_id]
    seq = model.next_seq + 100  # a seq_id ahead of any the client sends in this module: it waits its turn
    headers = {"X-API-Key": "tml-test", "Content-Type": "application/json"}
    body = {"model_id": training.model_id, "seq_id": seq, "type": "optim_step", "adam_params": {"learning_rate": 0.0}}
    first = httpx.post(f"{server.base_url}/api/v1/optim_step", json=body, headers=headers).json()
    again = httpx.post(f"{server.base_url}/api/v1/optim_step", json=body, headers=headers).json()
    assert first == again and len(model.queued) == 1  # one operation, whatever the retries
    behind = httpx.post(f"{server.base_url}/api/v1/optim_step", headers=headers,
                        json={**body, "seq_id": 0}).json()  # never posted, before the next expected
    assert "seq_id=0" in behind["detail"] and "before the next expected" in behind["detail"]
    model.queued.clear()
    model.posted.pop(seq)


def test_saved_state_restores_the_adapters_and_adams_moments(client, server):
    _, training = client
    adam = types.AdamParams(learning_rate=1e-2)
    step = lambda: (training.forward_backward([datum(TOKENS[::-1])], "cross_entropy").result(),
                    training.optim_step(adam).result())
    step()  # Adam's moments are non-zero from here
    saved = training.save_state("round-trip").result().path
    step()
    straight = training.forward([datum(TOKENS[::-1])], "cross_entropy").result().metrics["loss:sum"]
    training.load_state_with_optimizer(saved).result()
    step()  # the same step again: equal only if the moments came back too
    again = training.forward([datum(TOKENS[::-1])], "cross_entropy").result().metrics["loss:sum"]
    assert again == straight
    # the server restarted (`python -m rlinf_like.tinker serve` in a new process on the same --out): a client
    # created at the saved state takes the same step
    with serve_in_a_process(server.service.model_path, server.service.out) as base_url:
        with tinker.ServiceClient(base_url=base_url, api_key="tml-test") as service:
            resumed = service.create_training_client_from_state_with_optimizer(saved).result()
            resumed.forward_backward([datum(TOKENS[::-1])], "cross_entropy").result()
            resumed.optim_step(adam).result()
            assert resumed.forward([datum(TOKENS[::-1])], "cross_entropy").result().metrics["loss:sum"] == straight
            with pytest.raises(Exception, match="without the optimizer state is not supported"):
                service.create_training_client_from_state(saved).result()


@contextlib.contextmanager
def serve_in_a_process(model: str, out):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rlinf_like.tinker", "serve", "--model", model, "--port",
                             str(port), "--out", str(out)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_refusals_name_what_is_not_served(client, server):
    service, training = client
    with pytest.raises(Exception, match=r"stable_reinforce.*not supported here; supported: \['cross_entropy'"):
        training.forward_backward([datum(TOKENS)], "stable_reinforce").result()
    image = types.Datum(model_input=types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png",
                                                                                expected_tokens=4)]),
                        loss_fn_inputs={"target_tokens": [1, 2, 3, 4], "weights": [1.0] * 4})
    with pytest.raises(Exception, match="image chunk"):
        training.forward_backward([image], "cross_entropy").result()
    with pytest.raises(Exception, match=r"base_model='org/other-model' is not served here"):
        service.create_lora_training_client(base_model="org/other-model", rank=4).result()
    assert httpx.post(f"{server.base_url}/api/v1/client/config", json={}).status_code == 401  # no tml- key


def test_policy_losses_follow_their_definitions():
    logp = torch.tensor([-1.0, -0.5, -2.0], requires_grad=True)
    sampled, adv = torch.tensor([-1.2, -0.4, -1.0]), torch.tensor([1.0, -1.0, 2.0])
    inputs = {"logprobs": sampled, "advantages": adv}
    ratio = torch.exp(logp.detach() - sampled)
    clip = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert torch.allclose(losses.elementwise_loss("importance_sampling", logp, inputs, clip), -ratio * adv)
    ppo = losses.elementwise_loss("ppo", logp, inputs, clip)
    assert torch.allclose(ppo, -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv))
    cispo = losses.elementwise_loss("cispo", logp, inputs, clip)
    cispo.sum().backward()  # the clipped ratio is a weight: d/dlogp = -clip(r) * A
    assert torch.allclose(logp.grad, -ratio.clamp(0.8, 1.2) * adv)
    with pytest.raises(losses.UnsupportedLoss, match=r"loss_fn_config \['eps'\]"):
        losses.check_loss("ppo", {"eps": 0.2}, [])
    assert math.isclose(losses.check_loss("ppo", {"clip_high_threshold": 1.28}, [])["clip_high_threshold"], 1.28)


def test_a_finished_session_frees_its_model_for_the_next_client(server, tmp_path):
    """One training model at a time, but only while its session lasts: the end of `with ServiceClient()` posts
    `sessions/{id}/finish`, which drops the session's model (its workers end) and sampling sessions, so a recipe
    run twice against one server creates its model again instead of being refused."""
    path = server.service.model_path  # a second server on the module's in-process cluster (one a process)
    with serving(server.service.cluster, path, tmp_path / "out") as srv:
        service = srv.service
        with tinker.ServiceClient(base_url=srv.base_url, api_key="tml-test") as first:
            training = first.create_lora_training_client(base_model=path, rank=4).result()
            training.forward_backward([datum(TOKENS)], "cross_entropy").result()
            training.save_weights_and_get_sampling_client("s").result()
            [old] = service.models
            assert list(service.samplers) and all(s.startswith(old.split(":")[0]) for s in service.samplers)
            with tinker.ServiceClient(base_url=srv.base_url, api_key="tml-test") as meanwhile:
                with pytest.raises(Exception, match="one model at a time"):
                    meanwhile.create_lora_training_client(base_model=path, rank=4).result()
        assert service.models == {} and service.samplers == {}
        with tinker.ServiceClient(base_url=srv.base_url, api_key="tml-test") as second:
            again = second.create_lora_training_client(base_model=path, rank=4).result()
            again.forward_backward([datum(TOKENS)], "cross_entropy").result()
            assert list(service.models) != [old] and len(service.models) == 1


def test_closing_the_service_ends_every_thread_it_started(server, tmp_path):
    """A client that dies leaves its model behind (no `sessions/{id}/finish`). Closing the service still ends that
    model's workers and the sampling thread before it returns: a thread left to drop tensors while the interpreter
    exits aborts the process ("terminate called without an active exception")."""
    path = server.service.model_path
    before = set(threading.enumerate())
    service = TinkerService(path, served_names(path), tmp_path / "out", server.service.cluster)
    created = service.create_model("gone", 0, path, {"rank": 4})
    service.futures.get(created).result(timeout=120)
    service.create_sampling_session("gone", 0, None, path)  # an engine, which the sampling thread has held
    started = {t.name for t in threading.enumerate() if t not in before}
    assert {"tinker-gone:train:0", "tinker-sample"} <= started, started
    service.close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []
    assert service.models == {} and service.samplers == {}


def test_requests_posted_a_few_ms_apart_are_decoded_in_one_generate():
    """A recipe posts a step's samples one request at a time; the batcher waits for the rest (GATHER_GAP_S) instead
    of decoding the first alone. The engine here records its calls only: what is tested is the gathering."""
    from rlinf_like.tinker.sampling import Batcher

    calls = []

    class Recording:
        def generate(self, requests):
            calls.append(len(requests))
            raise RuntimeError("recorded")

    batcher, engine = Batcher(), Recording()
    futures = []
    for _ in range(6):
        futures.append(batcher.submit(engine, object(), {}))
        time.sleep(0.005)
    for future in futures:
        with pytest.raises(RuntimeError, match="recorded"):
            future.result(timeout=5)
    batcher.close()
    assert calls == [6]
