"""LoRA in the actor (`actor.lora.*`, peft under FSDP2): a real 2-rank FSDP actor and a native-engine rollout
on the tiny model, one set of groups for the module. Only adapters train and sit in the optimizer; the
rollout serves merge_and_unload()'s weights under base names and, after the first round, receives only the
adapted weights; the KL reference is the base with adapters disabled; checkpoints resume exactly; the
export loads in peft. Then the config checks, a 3-step GRPO run through `train` (its own Ray), and 2 GRPO steps
on the real SmolLM2-135M-Instruct (`real_model`: skipped, naming the command, without its folder), resumed."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from rlinf_like.data.batch import build_sft_batch
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig, check_targets_of
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs
from rlinf_like.hybrid_engines.tensors import local_tensor
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.common import connect_weight_sync
from rlinf_like.runtime import wait_all
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker
from rlinf_like.workers.rollout.base import RolloutConfig
from rlinf_like.workers.rollout.worker import RolloutWorker

RANK, ALPHA = 8, 16.0
TARGETS = ["q_proj", "v_proj"]  # two of the seven linear layers: the delta sync is then a small share


def sft_batch(seed: int, rows: int = 8):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 40, (5,), generator=g).tolist() for _ in range(rows)]
    targets = [torch.randint(3, 40, (6,), generator=g).tolist() for _ in range(rows)]
    return build_sft_batch(prompts, targets)


class LoraActor(ActorWorker):
    """The real actor, plus what the tests look at."""

    def full_params(self):
        return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in self.manager.model.named_parameters()}

    def optimizer_view(self):
        opt = self.manager.optimizer
        names = {id(p): n for n, p in self.manager.model.named_parameters()}
        params = [p for g in opt.param_groups for p in g["params"]]
        state = sum(local_tensor(t).numel() for p in params for t in opt.state.get(p, {}).values() if t.dim() > 0)
        frozen = [n for n, p in self.manager.model.named_parameters() if not p.requires_grad]
        return [names[id(p)] for p in params], sum(p.numel() for p in params), state, frozen

    def grads(self):
        return {n: p.grad is not None for n, p in self.manager.model.named_parameters()}

    def offload_round_trip(self):
        before = self.full_params()
        self.manager.offload()
        status = self.manager.get_status()
        self.manager.onload()
        after = self.full_params()
        return status.offloaded, status.device_bytes, all(torch.equal(before[n], after[n]) for n in before)

    def sft_no_step(self, batch):
        """forward/backward without the optimizer step: which parameters get a gradient."""
        self.manager.forward_backward(batch)
        out = self.grads()
        self.manager.clear_gradients()
        return out

    def logprobs(self, batch):
        return self.manager.compute_logprobs(batch)

    def adapters(self):
        return {n: t for n, t in self.full_params().items() if ".lora_" in n}

    def base_changed(self, model_dir):
        """Frozen parameters that differ from the checkpoint's tensors (bit for bit), by base name."""
        from safetensors.torch import load_file

        from rlinf_like.hybrid_engines.fsdp.lora import base_name

        saved = load_file(str(Path(model_dir) / "model.safetensors"))
        frozen = {base_name(n): t for n, t in self.full_params().items() if ".lora_" not in n}
        return [n for n, t in frozen.items() if not torch.equal(t, saved[n])]

    def digest(self):
        return digest(self.full_params())


class Rollout(RolloutWorker):
    def weights(self):
        return {n: t.detach().clone() for n, t in self.engine.weight_tensors().items()}

    def digest(self):
        return digest(self.engine.weight_tensors())

    def merge_report(self, model_dir, adapter_state, lora):
        """The served weights against `merged_reference`, here (so 0.5 GB of weights need not travel):
        names, tensors outside fp32 rounding, tensors bit-identical, tensors that differ from the base."""
        from safetensors.torch import load_file

        served = self.engine.weight_tensors()
        reference = merged_reference(model_dir, adapter_state, lora)
        base = load_file(str(Path(model_dir) / "model.safetensors"))
        mismatched = {}
        for name, tensor in served.items():
            try:  # fp32 rounding of W + s * (B @ A): see test_grpo_with_lora_on_the_real_model
                torch.testing.assert_close(tensor, reference[name], rtol=1e-6, atol=1e-7)
            except AssertionError as e:
                mismatched[name] = str(e).splitlines()[-2:]
        return {"served": sorted(served), "reference": sorted(reference), "mismatched": mismatched,
                "bit_identical": sum(torch.equal(t, reference[n]) for n, t in served.items()),
                "moved": [n for n, t in served.items() if n in base and not torch.equal(t, base[n])]}


def digest(tensors: dict[str, torch.Tensor]) -> str:
    """One hash of names and bytes: equal weights, bit for bit."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("lora") / "base", TinyModelSpec(seed=3)))


@pytest.fixture(scope="module")
def groups(cluster, model_dir):
    config = ActorConfig(model_path=model_dir, fsdp=FSDPConfig(
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        lora=LoraConfig(rank=RANK, alpha=ALPHA, dropout=0.1, target_modules=TARGETS)))
    placement = cluster.place({"lora_actor": "0-1", "lora_rollout": "0"})
    actor = LoraActor.create_group(config).launch(cluster, placement, "lora_actor")
    rollout = Rollout.create_group(RolloutConfig(model_path=model_dir, max_batch_size=4, dtype="float32")).launch(
        cluster, placement, "lora_rollout")
    plan = connect_weight_sync(actor, rollout, "lora_weights")
    yield actor, rollout, plan
    actor.shutdown()
    rollout.shutdown()


def merged_reference(model_dir, adapter_state, lora=LoraConfig(rank=RANK, alpha=ALPHA, target_modules=TARGETS)):
    """merge_and_unload() of a peft model on the base checkpoint holding the actor's adapters."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                           lora.peft_config())
    missing = model.load_state_dict(adapter_state, strict=False)
    assert not missing.unexpected_keys
    return model.merge_and_unload().state_dict()


def sync(actor, rollout, version):
    sent, received = wait_all([actor.publish_weights(version), rollout.apply_weights(version)])
    return sum(sent), sum(received)


def test_only_adapters_train_base_bit_unchanged_offload_and_merged_sync(groups, model_dir):
    actor, rollout, plan = groups
    names, trainable, state_numel, frozen = actor.on_ranks(0).optimizer_view().wait()[0]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)  # the optimizer: adapters only
    assert all(".lora_" not in n for n in frozen) and len(frozen) > len(names)
    grads = actor.sft_no_step(sft_batch(0)).wait()[0]
    assert {n for n, has in grads.items() if has} == {n for n in grads if ".lora_" in n}  # no base gradients

    before = actor.full_params().wait()[0]
    for step in range(2):  # B moves at step 1, A (whose gradient is B^T ...) from step 2
        actor.sft_step(sft_batch(step)).wait()
    after = actor.full_params().wait()[0]
    for name in before:
        if ".lora_" in name:
            assert not torch.equal(before[name], after[name]), f"adapter {name} did not train"
        else:
            assert torch.equal(before[name], after[name]), f"frozen {name} changed"
    _, _, state_numel, _ = actor.on_ranks(0).optimizer_view().wait()[0]
    local_adapter = sum(p.numel() for n, p in after.items() if ".lora_" in n) // 2  # FSDP: half per rank
    assert state_numel == 2 * local_adapter  # Adam's exp_avg + exp_avg_sq, adapter-sized

    offloaded, device_bytes, intact = actor.offload_round_trip().wait()[0]
    assert offloaded == {"params": True, "grads": True, "optimizer": True} and set(device_bytes.values()) == {0}
    assert intact  # bit-exact round trip of base weights and adapters

    # the first round sends everything; the rollout then holds merge_and_unload()'s weights, base names
    full_sent, full_received = sync(actor, rollout, 1)
    assert full_sent == full_received == plan.nbytes
    served = rollout.weights().wait()[0]
    reference = merged_reference(model_dir, {n: t for n, t in after.items() if ".lora_" in n})
    assert set(reference) >= set(served) and not any("lora" in n or "base_layer" in n for n in served)
    for name, tensor in served.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-6, atol=1e-7)  # fp32 rounding of B @ A
    exact = sum(torch.equal(t, reference[n]) for n, t in served.items())
    print(f"merged sync: {exact}/{len(served)} tensors bit-identical to merge_and_unload()")

    # later rounds: only the adapters (A and B of q_proj, v_proj); the rollout merges them
    actor.sft_step(sft_batch(5)).wait()
    delta_sent, delta_received = sync(actor, rollout, 2)
    adapters = sum(t.numel() * t.element_size() for n, t in after.items() if ".lora_" in n)
    assert delta_sent == delta_received == plan.delta.nbytes == adapters  # each adapter once (one rollout rank)
    assert delta_sent < 0.1 * full_sent, (delta_sent, full_sent)
    print(f"sync bytes: first {full_sent}, later {delta_sent} ({delta_sent / full_sent:.3f})")
    served = rollout.weights().wait()[0]
    now = actor.full_params().wait()[0]
    reference = merged_reference(model_dir, {n: t for n, t in now.items() if ".lora_" in n})
    for name, tensor in served.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(served[n], served_before) for n, served_before in
               ((n, merged_reference(model_dir, {k: t for k, t in after.items() if ".lora_" in k})[n])
                for n in served if "q_proj.weight" in n))  # the delta round did update the weights


def test_reference_is_the_base_model(groups, model_dir):
    from transformers import AutoModelForCausalLM

    actor, _, _ = groups
    actor.sft_step(sft_batch(7)).wait()  # adapters are non-zero: the policy differs from the base
    batch = sft_batch(9)
    base = token_logprobs(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), batch).detach()
    reference = torch.cat(actor.reference_logprobs(batch).wait())
    policy = torch.cat(actor.logprobs(batch).wait()[:1])
    torch.testing.assert_close(reference, base, rtol=1e-5, atol=1e-5)
    assert (policy - base).abs().max() > 1e-3  # the adapters are back on after the context


def test_checkpoint_resumes_exactly_and_holds_adapters_only(groups, model_dir, tmp_path):
    import json

    from torch.distributed.checkpoint import FileSystemReader

    actor, _, _ = groups
    path = str(tmp_path / "ckpt")
    actor.save(path).wait()
    saved = FileSystemReader(str(Path(path) / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys)  # no frozen base tensors
    assert json.loads((Path(path) / "lora.json").read_text())["base_model"] == model_dir
    first = [actor.sft_step(sft_batch(20 + i)).wait()[0] for i in range(2)]
    params = actor.full_params().wait()[0]
    actor.load(path).wait()
    again = [actor.sft_step(sft_batch(20 + i)).wait()[0] for i in range(2)]
    assert first == again  # dropout is on: the RNG state resumes too
    resumed = actor.full_params().wait()[0]
    assert all(torch.equal(params[n], resumed[n]) for n in params)


def test_export_merged_model_and_peft_adapter_folder(groups, model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    actor, _, _ = groups
    out = tmp_path / "export"
    actor.export_hf(str(out)).wait()
    batch = sft_batch(11)
    want = actor.logprobs(batch).wait()[0]
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                                           str(out / "adapter")).eval()
    torch.testing.assert_close(token_logprobs(peft_model, batch).detach(), want, rtol=1e-5, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    torch.testing.assert_close(token_logprobs(merged, batch).detach(), want, rtol=1e-5, atol=1e-5)


# --- config -------------------------------------------------------------------------------------------
def tiny_cfg(out, **lora):
    from small_runs import small_reasoning_config

    cfg = small_reasoning_config(out, max_steps=3, save_every=2)
    cfg.algorithm.kl_beta = 0.1
    cfg.actor.lora = LoraConfig(**{"rank": 8, **lora})
    return cfg


@pytest.mark.parametrize("change,message", [
    (lambda c: setattr(c.actor.lora, "rank", -1), r"actor.lora.rank must be >= 0"),
    (lambda c: setattr(c.actor.lora, "dropout", 1.0), r"actor.lora.dropout must be < 1"),
    (lambda c: setattr(c.actor.lora, "alpha", 0.0), r"actor.lora.alpha must be > 0"),
    (lambda c: setattr(c.actor, "backend", "megatron"),
     r"actor.lora.rank=8: LoRA with actor.backend=megatron is not supported yet"),
    (lambda c: setattr(c.runner, "sft_steps", 5), r"actor.lora.rank=8 with algorithm.kl_beta > 0 .* runner.sft_steps=0"),
    (lambda c: (setattr(c.runner, "schedule", "dynamic"), setattr(c.algorithm, "kl_beta", 0.0)),
     r"runner.schedule=dynamic with actor.lora.rank=8"),
])
def test_bad_lora_config_is_named_before_launch(tmp_path, change, message):
    from rlinf_like.runners.reasoning import check_config

    cfg = tiny_cfg(tmp_path)
    check_config(cfg)
    change(cfg)
    with pytest.raises(ValueError, match=message):
        check_config(cfg)


def test_lora_overrides_and_unknown_target_modules(model_dir):
    from rlinf_like.config import ConfigError, check_overrides
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    check_overrides(ReasoningConfig, ["actor.lora.rank=8", "actor.lora.alpha=32", "actor.lora.target_modules=[q_proj]"])
    with pytest.raises(ConfigError, match=r"actor.lora.rank must be >= 0"):
        check_overrides(ReasoningConfig, ["actor.lora.rank=-2"])
    with pytest.raises(ConfigError, match=r"unknown config key 'actor.lora.rnak'"):
        check_overrides(ReasoningConfig, ["actor.lora.rnak=8"])
    with pytest.raises(ValueError, match=r"actor.lora.target_modules names \['qproj'\], which are not linear "
                                         r"layers of the model; its linear layers are \[.*'q_proj'"):
        check_targets_of(LoraConfig(rank=4, target_modules=["qproj"]), model_dir)


# --- end to end ---------------------------------------------------------------------------------------
def run_grpo(out):
    from small_runs import in_process

    from rlinf_like.runners.reasoning import train

    cfg = in_process(tiny_cfg(out))
    cfg.actor.loss.entropy_coef = 0.01  # the untrained tiny model scores 0: the entropy term moves the adapters
    return train(cfg).history, (Path(out) / "workers.json").read_text()


@pytest.mark.timeout(300)
def test_grpo_with_lora_runs_and_launches_no_reference_worker(tmp_path):
    """3 GRPO steps with actor.lora.rank=8 (all linear layers) and a KL term, in process: no reference worker, the
    KL is computed in the actor (0 at the first step: B starts at 0, > 0 once the adapters moved), and the syncs
    after the first send only the adapted weights."""
    history, pids = run_grpo(str(tmp_path))
    steps = history[1:]
    assert [h["step"] for h in steps] == [1, 2, 3]
    assert '"reference"' not in pids and '"actor"' in pids
    assert abs(steps[0]["kl"]) < 1e-6 and steps[1]["kl"] > 0 and steps[2]["kl"] > 0
    assert steps[1]["sync_bytes"] == steps[2]["sync_bytes"] < steps[0]["sync_bytes"]
    print("sync bytes per step (all linear layers):", [h["sync_bytes"] for h in steps],
          "sync_s:", [round(h["sync_s"], 4) for h in steps],
          "step s:", [round(b["elapsed_s"] - a.get("elapsed_s", 0), 2) for a, b in zip(history, steps)])


# --- the real model -----------------------------------------------------------------------------------
REAL_LORA = LoraConfig(rank=8, alpha=16.0)  # every linear layer of the blocks, as the preset


def real_lora_config(out, model_path, resume=False):
    """The smallest GRPO run on SmolLM2-135M-Instruct with LoRA: one actor rank and one rollout replica on one
    CPU slot (a load of the model each), 2 prompts x 2 samples of 8 new tokens, 2 held-out problems, no SFT,
    a checkpoint every step."""
    from small_runs import small_reasoning_config

    cfg = small_reasoning_config(Path(out), max_steps=2, save_every=1, samples_per_prompt=2)
    cfg.cluster.component_placement = {"actor,rollout": "0", "reward": "0"}
    cfg.cluster.backend = "local"  # in process: no Ray and no worker processes to start
    cfg.model.path = model_path
    cfg.actor.lora = REAL_LORA
    cfg.data.test_problems = 2
    cfg.runner.prompts_per_step, cfg.runner.max_new_tokens, cfg.runner.resume = 2, 8, resume
    cfg.rollout.max_batch_size, cfg.rollout.max_context, cfg.rollout.kv_cache_memory_gb = 4, 192, 0.05
    cfg.rollout.dtype = "float32"  # the served merge is compared with peft's to fp32 rounding
    cfg.actor.loss.entropy_coef = 0.01  # the adapters move even if every sample of a group scores the same
    return cfg


def resumed_dir(out) -> Path:
    return Path(out).parent / "resumed"


def real_lora_run(out, model_path, resume=False, snapshot_at=None):
    """A run of `real_lora_config` in this (spawned) process, driven step by step so that the step-`snapshot_at`
    checkpoint can be copied to `resumed_dir(out)`; returns the history and what the test asserts on, computed
    in the workers (where the weights are)."""
    import shutil

    from rlinf_like.runners.reasoning import launch
    from rlinf_like.runners.reasoning.run import ReasoningRun
    from rlinf_like.runners.reasoning.schedules.collocated import run_step

    launch.RolloutWorker = Rollout  # in this process only: the rollout group answers `merge_report`
    with ReasoningRun(real_lora_config(out, model_path, resume), actor_worker=LoraActor) as run:
        for step in run.steps():
            run_step(run, step)
            if run.step == snapshot_at:
                shutil.copytree(Path(out) / "checkpoint", resumed_dir(out) / "checkpoint")
        actor, rollout = run.workers.actor, run.workers.rollout  # full_params is a collective: every rank
        adapters = actor.adapters().wait()[0]
        return run.history, {
            "lora_B": {n: bool(t.any()) for n, t in adapters.items() if ".lora_B." in n},
            "base_changed": actor.base_changed(model_path).wait()[0],
            "merge": rollout.on_ranks(0).merge_report(model_path, adapters, REAL_LORA).wait()[0],
            "actor": actor.digest().wait()[0], "rollout": rollout.on_ranks(0).digest().wait()[0]}


TIMED = ("_s", "tokens_per_s")  # wall-clock metrics: differ between any two runs


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_grpo_with_lora_on_the_real_model(real_model_8l_path, tmp_path):
    """2 GRPO steps on SmolLM2-135M-Instruct's first 8 layers (its checkpoint's names and shapes, its tokenizer; a
    third of the compute) with LoRA (all linear layers), then the same run resumed from its
    step-1 checkpoint, one after the other in one spawned process (its workers in process, the rollout class
    replaced there only): (a) the reward is
    computed; (b) the adapters trained (B != 0) and the base is bit-unchanged; (c) the rollout serves peft's
    merge_and_unload() of the actor's adapters on the base, under base names; (d) the resumed step 2 equals the
    uninterrupted one: metrics, actor parameters and served weights bit for bit."""
    import math
    import time

    out = tmp_path / "run"
    start = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        history, report = pool.submit(real_lora_run, str(out), real_model_8l_path, False, 1).result()
        first_s = time.perf_counter() - start
        resumed_history, resumed = pool.submit(real_lora_run, str(resumed_dir(out)), real_model_8l_path, True).result()
    steps = history[1:]
    assert [h["step"] for h in steps] == [1, 2]
    # (a) the reward is computed and finite at every step, with its accuracy and format rate; the held-out ones
    # before and after
    assert all(math.isfinite(h[k]) for h in steps for k in ("reward", "train_accuracy", "train_format_rate"))
    assert all(0 <= h[k] <= 1 for h in (history[0], steps[-1]) for k in ("eval_accuracy", "eval_format_rate"))
    # (b) peft starts every B at 0: after 2 steps each is non-zero; the frozen base is the checkpoint's, bit for bit
    assert report["lora_B"] and all(report["lora_B"].values()), [n for n, moved in report["lora_B"].items() if not moved]
    assert report["base_changed"] == []
    # (c) the rollout holds merge_and_unload()'s weights under base names, within fp32 rounding: both compute
    # W + s * (B @ A) in fp32, B @ A a sum over r = 8 terms whose order may differ between the two matmul calls,
    # so an element differs by a few ulps of W at most: rtol 1e-6 is ~8 ulps; atol 1e-7 covers elements near 0
    merge = report["merge"]
    assert merge["served"] and set(merge["served"]) <= set(merge["reference"])
    assert not any("lora" in n or "base_layer" in n for n in merge["served"])
    assert merge["mismatched"] == {}
    assert any(".q_proj." in n for n in merge["moved"])  # the served weights are merged, not the base's
    # (d) exact resume
    assert [h["step"] for h in resumed_history] == [0, 1, 2]
    untimed = lambda h: {k: v for k, v in h.items() if not k.endswith(TIMED)}
    assert untimed(resumed_history[2]) == untimed(history[2])
    assert (resumed["actor"], resumed["rollout"]) == (report["actor"], report["rollout"])
    shown = ("reward", "train_format_rate", "eval_accuracy", "eval_format_rate", "sync_bytes")
    print(f"real-model LoRA: {merge['bit_identical']}/{len(merge['served'])} served tensors bit-identical to "
          f"merge_and_unload(); run {first_s:.1f} s, resumed run {time.perf_counter() - start - first_s:.1f} s; "
          f"steps: {[{k: round(v, 4) for k, v in h.items() if k in shown} for h in history]}")
