"""MegatronModelManager on a GPU (marked `gpu`; not yet run: no GPU was lent so far). One spawned
process with NCCL: TransformerEngine layer spec when TE imports, bf16, training lowers the loss,
logprobs agree with transformers within bf16 tolerance, and offload frees the device memory of
params, grads and optimizer state, with a bit-exact onload."""

import datetime
import importlib.util
import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

SPEC = TinyModelSpec(arch="qwen2", hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                     init_std=0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(step):
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, 90, (8, 1), generator=g)
    ids = (start + 3 * torch.arange(32)) % 90 + 4
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _run(path, port, results):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager
    from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    manager = MegatronModelManager(path, MegatronConfig(precision="bf16", optim=OptimConfig(lr=1e-3)))
    batch = _batch(99)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
    reference = token_logprobs(hf, {k: v.cuda() for k, v in batch.items()}).float().cpu()
    before = manager.compute_logprobs(batch).float()
    losses = []
    for step in range(8):
        losses.append(manager.forward_backward(_batch(step))["loss"])
        manager.optim_step()
    logprobs = manager.compute_logprobs(batch)
    allocated = torch.cuda.memory_allocated()
    manager.offload()
    freed = allocated - torch.cuda.memory_allocated()
    held = manager.residency.host_bytes()
    manager.onload()
    results.put({"config": manager.get_config(), "max_gap": float((before - reference).abs().max()),
                 "losses": losses, "freed": freed, "held": held,
                 "onload_exact": torch.equal(logprobs, manager.compute_logprobs(batch))})
    dist.destroy_process_group()


@pytest.mark.gpu
def test_megatron_on_gpu_bf16_te_spec_and_offload(tmp_path):
    pytest.importorskip("megatron.core")
    path = str(write_tiny_model(tmp_path / "m", SPEC))
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_run, args=(path, _free_port(), results))
    proc.start()
    out = results.get(timeout=300)
    proc.join(60)
    te = importlib.util.find_spec("transformer_engine") is not None
    assert out["config"]["layer_spec"] == ("te" if te else "local")
    assert out["config"]["dtype"] == "torch.bfloat16"
    assert out["max_gap"] < 0.1  # bf16 numerics differ by kernel, not by layout
    assert out["losses"][-1] < out["losses"][0] - 0.1
    assert out["freed"] >= 0.9 * out["held"] > 0  # params, grads and optimizer state left the device
    assert out["onload_exact"]
