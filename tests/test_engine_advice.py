"""The engine registry's CPU recommendation (issue 22): vLLM declares itself the recommended CPU engine for real
checkpoints with the measured reason, the engine listing shows it, and a run that serves a real checkpoint on CPU
with another engine gets one advice line when vLLM is installed; tiny models, GPUs and vLLM runs get none."""

import math

import pytest

from rlinf_like.config.show import main as show
from rlinf_like.models import read_hf_config
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig
from rlinf_like.workers.rollout.engine import engine_class
from rlinf_like.workers.rollout.engines.engine_advice import (REAL_MODEL_PARAMS, cpu_advice, cpu_recommended_engines,
                                                      engine_listing, is_real_model, parameter_count)
from rlinf_like.workers.rollout.engines.staged_engine import checkpoint_shapes



def test_vllm_declares_the_recommendation_with_its_measured_ratio_and_the_listing_shows_it(capsys):
    assert cpu_recommended_engines() == ["vllm"]
    assert "native / vLLM tokens/s = 0." in engine_class("vllm").cpu_real_model_choice
    assert not engine_class("native").cpu_real_model_choice  # the default engine stays the default
    listing = engine_listing().splitlines()
    at = next(i for i, line in enumerate(listing) if line.strip().startswith("vllm:"))
    assert "supports_tp" in listing[at] and "recommended CPU engine for real models" in listing[at + 1]
    show(["engines"])
    assert "recommended CPU engine for real models" in capsys.readouterr().out


@pytest.mark.real_model
def test_parameter_count_from_config_is_the_checkpoints_and_smollm2_is_real(real_model_path):
    counted = sum(math.prod(shape) for shape in checkpoint_shapes(real_model_path).values())
    assert parameter_count(read_hf_config(real_model_path)) == counted  # 134,515,008 (tied LM head)
    assert counted >= REAL_MODEL_PARAMS and is_real_model(real_model_path)


@pytest.mark.real_model
def test_advice_for_a_real_checkpoint_on_cpu_with_the_native_engine_only(real_model_path, tmp_path):
    real = RolloutConfig(engine="native", model_path=real_model_path)
    advice = cpu_advice(real, "cpu", importable=lambda module: module == "vllm")
    assert advice is not None and "rollout.engine=vllm" in advice and "0." in advice
    assert cpu_advice(real, "cuda:0", importable=lambda m: True) is None  # measured on CPU only
    assert cpu_advice(real, "cpu", importable=lambda m: False) is None  # vLLM not installed: nothing to switch to
    assert cpu_advice(RolloutConfig(engine="vllm", model_path=real_model_path), "cpu", lambda m: True) is None
    tiny = str(write_tiny_model(tmp_path / "tiny", TinyModelSpec()))
    assert not is_real_model(tiny)
    assert cpu_advice(RolloutConfig(engine="native", model_path=tiny), "cpu", lambda m: True) is None
