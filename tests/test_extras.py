"""GPU-first stacks are optional: importing them without the extra names the extra."""

import sys

import pytest

from rlinf_like.utils.extras import MissingExtraError, require


@pytest.mark.parametrize("module,extra", [("megatron.core", "[megatron]"), ("sglang", "[sglang]")])
def test_missing_extra_is_named(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail like a missing package
    with pytest.raises(MissingExtraError) as err:
        require(module)
    assert extra in str(err.value) and module in str(err.value)


def test_present_module_is_returned():
    assert require("json").dumps([1]) == "[1]"


def test_core_does_not_import_gpu_stacks():
    import rlinf_like.runtime  # noqa: F401

    assert not any(m.split(".")[0] in ("sglang", "megatron", "transformer_engine") for m in sys.modules if sys.modules[m])
