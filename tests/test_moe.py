"""Mixture-of-experts models (Qwen3-MoE, Mixtral) and routing replay (R3: the rollout's routes; R2: the trainer's
own, recorded when it recomputes pi_old).

Tiny random MoE checkpoints with routers wide enough (std 0.5) that routes are far from uniform: the native engine
against transformers, the per-expert checkpoint tensors stacked in memory, the routes the engine returns, and the
trainer's forward under replay: forced routes are the ones run, a permutation changes the output, the router keeps
its gradient, and replaying the trainer's own routes changes no bit."""

import pytest
import torch
from small_runs import in_process, small_reasoning_config
from transformers import AutoModelForCausalLM

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines import routing_replay
from rlinf_like.hybrid_engines.model_manager import token_logprobs
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.models.families import ModelConfig
from rlinf_like.models.families.config import check_checkpoint, checkpoint_names
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning import train
from rlinf_like.runners.reasoning.phases import rl_batch
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native import model as native

SPECS = {
    # one dense-MLP layer among MoE ones (mlp_only_layers), top-k not renormalised
    "qwen3_moe": TinyModelSpec(arch="qwen3_moe", num_layers=3, mlp_only_layers=(1,)),
    "qwen3_moe-renorm-tied": TinyModelSpec(arch="qwen3_moe", norm_topk_prob=True, tie_word_embeddings=True),
    "mixtral": TinyModelSpec(arch="mixtral"),
    "mixtral-tied": TinyModelSpec(arch="mixtral", tie_word_embeddings=True),
}
PROMPTS = [[10, 11, 12, 13, 14, 15], [20, 30, 40], [50, 51, 52, 53, 54, 55, 56, 57]]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: str(write_tiny_model(root / name, spec)) for name, spec in SPECS.items()}


def decoder(path: str, dtype=torch.float32) -> native.Decoder:
    cfg = native.model_config(path)
    weights = native.load_shards(path, native.weight_layouts(cfg, 1, dtype), 0, dtype, cfg)
    return native.Decoder(cfg, native.fuse_projections(cfg, weights))


def test_experts_are_per_expert_tensors_on_disk_and_one_stacked_tensor_in_memory(paths):
    cfg = native.model_config(paths["mixtral"])
    disk = checkpoint_names(paths["mixtral"])
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in disk
    check_checkpoint(cfg, disk)  # every tensor used
    with pytest.raises(ValueError, match=r"does not map.*experts\.4\.w1"):
        check_checkpoint(cfg, disk | {"model.layers.0.block_sparse_moe.experts.4.w1.weight"})
    with pytest.raises(ValueError, match=r"lacks weights.*experts\.2\.w3"):
        check_checkpoint(cfg, disk - {"model.layers.1.block_sparse_moe.experts.2.w3.weight"})
    ours = decoder(paths["mixtral"]).w
    hf = AutoModelForCausalLM.from_pretrained(paths["mixtral"], dtype=torch.float32).state_dict()
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
                 "model.layers.1.mlp.gate.weight"):
        assert torch.equal(ours[name], hf[name]), name  # the names and layout the actor's weight sync sends
    qwen = ModelConfig.from_path(paths["qwen3_moe"])
    assert qwen.moe_layers == (True, False, True)
    names = dict(qwen.named_weights())
    assert "model.layers.1.mlp.gate_proj.weight" in names and "model.layers.1.mlp.gate.weight" not in names
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and "model.layers.0.mlp.gate_proj.weight" not in names


def test_mixture_of_experts_refusals_name_the_key():
    base = TinyModelSpec(arch="mixtral")
    from rlinf_like.models.tiny import build_tiny_model

    hf = build_tiny_model(base)[0].config.to_dict()
    with pytest.raises(ValueError, match=r"router_jitter_noise=0.1 is not supported by the 'mixtral' family"):
        ModelConfig.from_hf({**hf, "router_jitter_noise": 0.1})
    with pytest.raises(ValueError, match=r"num_experts_per_tok >= 1 \(got 4 and 5\)"):
        ModelConfig.from_hf({**hf, "num_experts_per_tok": 5})
    cfg = ModelConfig.from_hf(hf)
    with pytest.raises(ValueError, match=r"runs at rollout.tp=1 \(got 2\)"):
        native.weight_layouts(cfg, 2, torch.float32)


@pytest.mark.parametrize("name", list(SPECS))
def test_native_engine_equals_transformers_and_returns_the_routes_it_ran(name, paths):
    path = paths[name]
    dec = decoder(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.tensor(PROMPTS[2] + PROMPTS[0])
    dec.capture_routes = True
    ours = torch.log_softmax(dec.score(ids), -1)
    with torch.no_grad():
        ref = torch.log_softmax(hf(ids[None]).logits[0], -1)
    assert (ours - ref).abs().max() < 1e-4
    assert len(dec.routes) == sum(dec.cfg.moe_layers)
    # the engine's routes are transformers' top-k for the same tokens
    outputs = hf(ids[None], output_router_logits=True)
    for ours_routes, logits in zip(dec.routes, outputs.router_logits):
        theirs = torch.topk(torch.softmax(logits.float(), -1), dec.cfg.experts_per_token, -1).indices
        assert torch.equal(ours_routes, theirs)
    assert len({tuple(r) for r in dec.routes[0].tolist()}) > 1  # routes differ by token: the router is not flat

    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    reqs = [RolloutRequest(f"r{i}", p, params, 1) for i, p in enumerate(PROMPTS)]
    engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=4, dtype="float32",
                                       return_routes=True))
    results = engine.generate(reqs)
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(PROMPTS[0]):].tolist()
    assert results[0].response_ids[0] == greedy
    for res in results:  # one route per prompt and response token, every MoE layer, k experts
        [routes] = res.routes
        assert routes.shape == (len(res.prompt_ids) + 8, sum(dec.cfg.moe_layers), dec.cfg.experts_per_token)
        assert routes.dtype == torch.uint8
        dec.routes = []
        dec.score(torch.tensor(res.prompt_ids + res.response_ids[0]))
        # the prefill's and each decode step's routes are the ones one pass over the sequence takes; the last
        # token ran through no pass (zeros: its position's output feeds no loss)
        assert torch.equal(routes[:-1].long(), torch.stack(dec.routes, 1)[:-1])
        assert not routes[-1].any()


def _trainer_batch(path):
    """A batch of the engine's samples with their routes, and the HF model the actor would train."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=8, dtype="float32",
                                       return_routes=True))
    results = engine.generate([RolloutRequest(f"r{i}", p, params, 2) for i, p in enumerate(PROMPTS)])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return rl_batch(results, pad_id=0), model


def test_replay_forces_the_routes_keeps_the_router_gradient_and_changes_no_bit_when_they_agree(paths):
    batch, model = _trainer_batch(paths["qwen3_moe"])
    assert batch["routes"].shape[:2] == batch["input_ids"].shape
    free = token_logprobs(model, batch)
    routing_replay.install(model, replay=True)
    # the trainer's own routes (a batch without routes runs them), replayed: the same forward, bit for bit
    assert torch.equal(token_logprobs(model, {k: v for k, v in batch.items() if k != "routes"}), free)
    state = model._route_replay
    own = torch.stack([state.own[i] for i in sorted(state.own)], 1).view(*batch["input_ids"].shape, 2, 2)
    assert torch.equal(token_logprobs(model, {**batch, "routes": own}), free)
    # the engine's routes agree here (same dtype) on almost every token; the metrics say how many
    metrics = routing_replay.agreement(model, batch)
    assert 0.9 < metrics["moe/router_agreement"] <= 1.0
    # forced routes are the ones run: other experts give other logprobs
    permuted = ((batch["routes"].long() + 1) % 4).to(torch.uint8)
    mask = batch["response_mask"].bool()
    moved = token_logprobs(model, {**batch, "routes": permuted})
    assert (moved - free)[mask].abs().max() > 1e-2
    assert routing_replay.agreement(model, {**batch, "routes": permuted})["moe/router_agreement"] < 0.5
    # ... and the router still learns: its weights get a gradient through the replayed experts' weights
    model.zero_grad()
    (token_logprobs(model, {**batch, "routes": permuted})[mask]).sum().backward()
    router = routing_replay.routers(model)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_replay_follows_the_tokens_into_packed_rows(paths):
    batch, model = _trainer_batch(paths["mixtral"])
    routing_replay.install(model, replay=True)
    permuted = {**batch, "routes": ((batch["routes"].long() + 1) % 4).to(torch.uint8)}
    padded = token_logprobs(model, permuted)
    packed = token_logprobs(model, pack_batch(permuted))
    mask = batch["response_mask"].bool()
    assert (padded - packed)[mask].abs().max() < 1e-5


def test_r2_records_the_trainers_routes_padded_or_packed_and_replays_them_after_the_router_moved(paths):
    batch, model = _trainer_batch(paths["qwen3_moe"])
    batch = {k: v for k, v in batch.items() if k != "routes"}  # R2 needs no engine routes
    routing_replay.install(model, replay=True)
    free = token_logprobs(model, batch)
    recorded = routing_replay.recorded_routes(model, batch)
    assert recorded.shape == (*batch["input_ids"].shape, 2, 2) and recorded.dtype == torch.uint8
    token_logprobs(model, pack_batch(batch))
    real = batch["attention_mask"].bool()
    packed = routing_replay.recorded_routes(model, pack_batch(batch))
    assert torch.equal(packed[real], recorded[real]) and not packed[~real].any()  # the same tokens' routes
    # replaying what was recorded is the recording forward, bit for bit
    assert torch.equal(token_logprobs(model, {**batch, "routes": recorded}), free)
    # an update moves the routers: their own choice now differs, and replay still runs pi_old's experts
    with torch.no_grad():
        for router in routing_replay.routers(model):
            router.weight.add_(torch.randn_like(router.weight, generator=torch.Generator().manual_seed(1)) * 0.5)
    moved = token_logprobs(model, batch)
    replayed = token_logprobs(model, {**batch, "routes": recorded})
    assert routing_replay.agreement(model, {**batch, "routes": recorded})["moe/router_agreement"] < 0.9
    mask = batch["response_mask"].bool()
    assert (replayed - moved)[mask].abs().max() > 1e-3


def test_a_grpo_run_with_r2_replays_the_routes_its_recomputation_recorded(paths, tmp_path):
    cfg = in_process(small_reasoning_config(tmp_path / "run"))
    cfg.model.path, cfg.actor.routing_replay, cfg.actor.precision = paths["mixtral"], "R2", "fp32"
    cfg.algorithm.recompute_logprobs = True
    history = train(cfg).history
    # the engine returned no routes: the metric exists because the recomputation's reached the update. One
    # optimizer step a batch, so every update forward runs the recorded weights: its routers choose as they did
    # (misaligned routes would agree by chance, ~1/6 of pairs for 2 of 4 experts)
    agreement = [h["moe/router_agreement"] for h in history[1:]]
    assert len(agreement) == 2 and all(a > 0.99 for a in agreement), agreement


def test_a_run_batch_refuses_samples_without_routes():
    from rlinf_like.workers.rollout.types import RolloutResult

    routes = [torch.zeros(3, 1, 2, dtype=torch.uint8)]
    with_routes = RolloutResult("a", [1, 2], [[3]], [[-0.1]], ["stop"], routes=routes)
    without = RolloutResult("b", [1, 2], [[3]], [[-0.1]], ["stop"])
    assert rl_batch([with_routes], 0)["routes"].shape == (1, 3, 1, 2)
    with pytest.raises(ValueError, match=r"samples \['b\[0\]'\] came back without routes"):
        rl_batch([with_routes, without], 0)
    assert "routes" not in build_rl_batch([[1]], [[2]], [[0.0]], [0.0])


def test_routing_replay_is_refused_before_launch_where_it_cannot_run(paths, tmp_path):
    from dataclasses import replace

    from rlinf_like.runners.reasoning import check_config
    from rlinf_like.runners.reasoning.config import (
        ActorSection, AlgorithmConfig, ModelSection, ReasoningConfig, RunnerConfig,
    )
    from rlinf_like.workers.rollout.base import RolloutConfig as RolloutSection

    run = RunnerConfig(output_dir=str(tmp_path))
    r3 = ActorSection(routing_replay="R3")
    with pytest.raises(ValueError, match=r"actor.routing_replay=R3 needs a mixture-of-experts model \(families "
                                         r"\['qwen3_moe', 'mixtral'\]\); model.path='\(the tiny dense model\)'"):
        check_config(ReasoningConfig(runner=run, actor=r3))
    moe = ModelSection(path=paths["mixtral"])
    check_config(ReasoningConfig(runner=run, actor=r3, model=moe))
    with pytest.raises(ValueError, match=r"rollout.engine=.hf. does not return mixture-of-experts routes; use "
                                         r"rollout.engine in \['native'\]"):
        check_config(ReasoningConfig(runner=run, actor=r3, model=moe, rollout=RolloutSection(engine="hf")))
    with pytest.raises(ValueError, match=r"rollout.return_routes needs a mixture-of-experts model"):
        check_config(ReasoningConfig(runner=run, rollout=RolloutSection(return_routes=True)))
    r2 = ActorSection(routing_replay="R2")
    with pytest.raises(ValueError, match=r"actor.routing_replay=R2 records the routes in the trainer's "
                                         r"recomputation of pi_old: set algorithm.recompute_logprobs=true"):
        check_config(ReasoningConfig(runner=run, actor=r2, model=moe))
    recompute = AlgorithmConfig(recompute_logprobs=True)
    # R2's routes come from the trainer: an engine that returns none is fine
    check_config(ReasoningConfig(runner=run, actor=r2, model=moe, algorithm=recompute,
                                 rollout=RolloutSection(engine="hf")))
    with pytest.raises(ValueError, match=r"actor.routing_replay=R2 needs a mixture-of-experts model"):
        check_config(ReasoningConfig(runner=run, actor=r2, algorithm=recompute))
    with pytest.raises(ValueError, match=r"actor.routing_replay=R3 with actor.loop.share_prompt=true"):
        check_config(ReasoningConfig(runner=run, model=moe,
                                     actor=replace(r3, loop=replace(r3.loop, share_prompt="true"))))


def test_a_grpo_run_of_a_moe_model_with_r3_logs_the_router_agreement(paths, tmp_path):
    cfg = in_process(small_reasoning_config(tmp_path / "run"))
    cfg.model.path, cfg.actor.routing_replay = paths["qwen3_moe"], "R3"
    history = train(cfg).history
    agreement = [h["moe/router_agreement"] for h in history[1:]]
    assert len(agreement) == 2 and all(0.5 < a <= 1.0 for a in agreement), agreement


@pytest.mark.parametrize("real", [False, pytest.param(True, marks=pytest.mark.real_model)])
def test_upcycled_identical_experts_compute_the_dense_model(real, tmp_path):
    from pathlib import Path

    from rlinf_like.models.upcycle import upcycle

    if real:
        dense = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"
        if not (dense / "config.json").exists():
            pytest.skip("needs models/smollm2-135m-instruct (rlinf_like.models.get smollm2-135m-instruct models/)")
    else:
        dense = write_tiny_model(tmp_path / "dense", TinyModelSpec(arch="llama"))
    ids = torch.tensor([[5, 17, 29, 41, 53, 65, 77, 89]])
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)(ids).logits
    same = upcycle(dense, tmp_path / "same", experts=4, top_k=2, noise=0.0, router_std=0.5)
    assert ModelConfig.from_path(same).family.name == "mixtral"
    with torch.no_grad():
        moe = AutoModelForCausalLM.from_pretrained(same, dtype=torch.float32)
        assert (moe(ids).logits - ref).abs().max() < 1e-4 * ref.abs().max()
    if real:  # the noise and the engine on the tiny model are enough: each real model is 1.4 GB written
        return
    noisy = upcycle(dense, tmp_path / "noisy", experts=4, top_k=2, noise=0.05, router_std=0.5)
    with torch.no_grad():
        moved = AutoModelForCausalLM.from_pretrained(noisy, dtype=torch.float32)(ids).logits
    assert (moved - ref).abs().max() > 1e-3 * ref.abs().max()  # the noise reaches the output: routes matter
    dec = decoder(str(noisy))  # the native engine serves it: every tensor used, the same function
    assert (torch.log_softmax(dec.score(ids[0]), -1) - torch.log_softmax(moved[0], -1)).abs().max() < 1e-4


def test_a_batch_with_routes_trains_row_by_row_even_where_prompts_would_be_shared(paths):
    from rlinf_like.training.loop import LoopConfig, LoopTerms, plan_steps

    batch, _ = _trainer_batch(paths["qwen3_moe"])
    loop = LoopConfig(share_prompt="true")
    shared = next(plan_steps({k: v for k, v in batch.items() if k != "routes"}, 0, 1, loop, 0, 1,
                             terms=LoopTerms(share_pair_cost=0.0)))
    assert any(m.get("shared_prompts") is not None for m, _ in shared)
    rows = next(plan_steps(batch, 0, 1, loop, 0, 1, terms=LoopTerms(share_pair_cost=0.0)))
    assert all(m.get("shared_prompts") is None and "routes" in m for m, _ in rows)


def test_routes_of_preempted_and_resumed_samples_are_those_of_an_unpreempted_run(paths):
    from rlinf_like.workers.rollout.engines.native.model import kv_bytes_per_token

    path = paths["mixtral"]
    params = SamplingParams(max_new_tokens=40, temperature=1.0, ignore_eos=True, seed=5)
    reqs = [RolloutRequest(f"r{i}", p * 3, params, 2) for i, p in enumerate(PROMPTS)]

    def engine(blocks=None):
        cfg = native.model_config(path)
        budget = None if blocks is None else blocks * 4 * kv_bytes_per_token(cfg, 1, torch.float32) / 2**30
        return make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=8, dtype="float32",
                                         kv_block_size=4, max_context=80, return_routes=True,
                                         **({} if budget is None else {"kv_cache_memory_gb": budget})))

    big, small = engine(), engine(blocks=40)
    expected, results = big.generate(reqs), small.generate(reqs)
    assert small.preemptions > 0 and big.preemptions == 0
    for got, want in zip(results, expected):
        assert got.response_ids == want.response_ids
        assert all(torch.equal(a, b) for a, b in zip(got.routes, want.routes))


def test_weight_sync_from_fsdp_shards_into_the_native_engine_is_bit_exact_experts_included(paths):
    """The actor's HF state dict (experts stacked, as FSDP2 shards them: dim 0 over 2 ranks) into the engine's
    layouts through the reshard planner: every tensor exact, and the engine then decodes the new weights."""
    from rlinf_like.hybrid_engines.reshard import apply_in_process, plan_reshard, sharded

    path = paths["qwen3_moe"]
    engine = make_engine(RolloutConfig(engine="native", model_path=path, dtype="float32"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(1.25 if "experts" in name or "mlp.gate" in name else 1.0)  # "trained": experts and routers moved
    actor = {n: p.detach().clone() for n, p in model.state_dict().items()}
    sources = [sharded(n, tuple(t.shape), 2, dim=0, dtype=str(t.dtype)) for n, t in actor.items()]
    shards = {r: {n: t.tensor_split(2, dim=0)[r].clone() for n, t in actor.items()} for r in range(2)}
    received = engine.weight_tensors()
    assert "model.layers.0.mlp.experts.gate_up_proj" in received
    apply_in_process(plan_reshard(sources, engine.weight_layouts()), shards, {0: received})
    for name, tensor in received.items():
        assert torch.equal(tensor, actor[name]), name
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    [result] = engine.generate([RolloutRequest("r", PROMPTS[0], params, 1)])
    with torch.no_grad():
        greedy = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                                pad_token_id=0)[0, len(PROMPTS[0]):].tolist()
    assert result.response_ids[0] == greedy


def test_routing_replay_is_refused_where_routes_would_not_reach_the_trainer(paths, tmp_path):
    from dataclasses import replace

    from rlinf_like.runners.reasoning import check_config
    from rlinf_like.runners.reasoning.config import (
        ActorSection, AlgorithmConfig, ModelSection, ReasoningConfig, RunnerConfig,
    )

    base = ReasoningConfig(runner=RunnerConfig(output_dir=str(tmp_path)), actor=ActorSection(routing_replay="R3"),
                           model=ModelSection(path=paths["mixtral"]))
    with pytest.raises(ValueError, match=r"actor.routing_replay=R3 is not built for "
                                         r"algorithm.recompute_by_length=true"):
        check_config(replace(base, algorithm=AlgorithmConfig(recompute_logprobs=True, recompute_by_length=True),
                             actor=replace(base.actor, precision="fp32")))
    with pytest.raises(ValueError, match=r"is not built for runner.migrate_at=0.5"):
        check_config(replace(base, runner=replace(base.runner, schedule="dynamic", migrate_at=0.5)))


def test_model_flops_count_the_chosen_experts_and_the_router(paths):
    from rlinf_like.utils.flops import ModelShape

    for name in ("qwen3_moe", "mixtral"):
        cfg = ModelConfig.from_path(paths[name])
        shape = ModelShape.from_path(paths[name])
        attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
        sparse = cfg.hidden_size * (cfg.num_experts + 3 * cfg.experts_per_token * cfg.moe_intermediate_size)
        dense = 3 * cfg.hidden_size * cfg.intermediate_size
        moe = sum(cfg.moe_layers)
        assert shape.body_params == cfg.num_layers * attn + moe * sparse + (cfg.num_layers - moe) * dense
    assert ModelShape.from_path(paths["qwen3_moe"]).moe_layers == 2  # 3 layers, one dense (mlp_only_layers)


def test_the_memory_estimate_counts_every_expert(paths):
    from rlinf_like.workers.rollout.engines.engine_advice import parameter_count

    for name in ("qwen3_moe", "mixtral"):
        model = AutoModelForCausalLM.from_pretrained(paths[name], dtype=torch.float32)
        held = sum(p.numel() for p in model.parameters())
        # within Qwen3's q/k norms (a few hundred weights), which the count leaves out for the dense families too
        assert parameter_count(model.config.to_dict()) == pytest.approx(held, rel=1e-3), name
