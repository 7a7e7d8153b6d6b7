"""Model builders and loaders shared by workers (HF checkpoints in, tiny local models for tests)."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    """The checkpoint's fast tokenizer exactly as its tokenizer.json defines it.

    (transformers' AutoTokenizer may substitute a model-specific class that re-derives
    pre-tokenisation from the model type; reading tokenizer.json directly is faithful for any
    checkpoint that ships one, which modern Llama / Qwen checkpoints do.)"""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))
