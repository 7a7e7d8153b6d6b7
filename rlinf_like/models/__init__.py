"""Model builders and loaders shared by workers (HF checkpoints in, tiny local models for tests)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path, key: str = "model.path"):
    """The checkpoint's fast tokenizer exactly as its tokenizer.json defines it.

    (transformers' AutoTokenizer may substitute a model-specific class that re-derives
    pre-tokenisation from the model type; reading tokenizer.json directly is faithful for any
    checkpoint that ships one, which modern Llama / Qwen checkpoints do.)"""
    from transformers import PreTrainedTokenizerFast

    folder = Path(path)
    if folder.is_dir() and not (folder / "tokenizer.json").is_file():
        # transformers would fall back to converting a slow tokenizer and fail on sentencepiece or tiktoken
        present = sorted(p.name for p in folder.iterdir() if p.is_file())
        raise FileNotFoundError(f"{key}={str(path)!r}: the folder has no tokenizer.json (the fast tokenizer every "
                                f"engine reads); it holds {present[:12]}. Copy the tokenizer files (tokenizer.json, "
                                "tokenizer_config.json) from the model's source, or save them with the model's "
                                "tokenizer.save_pretrained(folder)")
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def read_hf_config(path: str | Path, key: str = "model.path") -> dict:
    """The config.json of a local checkpoint folder, or of a hub id (through the Hugging Face cache or the
    Hub); a path that is neither is refused naming `key`."""
    import json
    import re

    folder = Path(path)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{key}={str(path)!r}: the folder has no config.json (not an HF checkpoint)")
        return json.loads((folder / "config.json").read_text())
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", str(path)) or str(path).startswith((".", "-")):
        raise FileNotFoundError(f"{key}={str(path)!r} is neither a local folder nor a Hugging Face hub id "
                                f"(org/name)")
    from huggingface_hub import hf_hub_download

    try:
        return json.loads(Path(hf_hub_download(str(path), "config.json")).read_text())
    except Exception as err:  # offline, unknown repository, gated model: all mean the same to the user
        raise FileNotFoundError(f"{key}={str(path)!r} is not a local folder, and as a Hugging Face hub id it "
                                f"could not be read ({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
