"""What turns exported weights (config.json, model.safetensors) into a folder a user loads and chats with:
`complete_export` writes the run's tokenizer, the chat template its prompts were rendered with, a generation
config whose bos/eos/pad ids are the tokenizer's, and (LoRA) the base model in the adapter's config.

The tokenizer is saved with its class pinned to `PreTrainedTokenizerFast`: the class that reads tokenizer.json
as it is, as the run's `load_tokenizer` does, under a name transformers 4 and 5 both know (5 saves it as
`TokenizersBackend`, its new name). transformers 5 ignores the pinned class for a few model types it lists as
having wrong hub classes (`qwen2` among them) and builds its own model-specific class from the vocabulary there
(`Qwen2Tokenizer`: byte-level pre-tokenization); that is right for their real tokenizers, not for e.g. the tiny
test models' character vocabulary, whose spaces it drops. So the export loads the folder with AutoTokenizer,
compares it with the run's tokenizer on a few strings, and says so when they differ.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ADAPTER_DIR = "adapter"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
PINNED_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# tokenizer_config keys that describe how the run loaded the tokenizer, not the tokenizer
_LOAD_KEYS = ("is_local", "local_files_only")
PROBES = ("Hello world", "What is 12 + 34?  Answer: 46\n", " leading space,\ttab and  two spaces")


def base_model_id(path: str) -> str:
    """A local folder as its absolute path; anything else (a hub id) as given."""
    folder = Path(path)
    return str(folder.resolve()) if folder.is_dir() else path


def complete_export(path: str | Path, tokenizer, chat_template: str | None, base_model: str | None = None) -> list[str]:
    """Complete the exported model at `path` (config.json and the weights already there): the tokenizer,
    `chat_template` (the Jinja text the run rendered prompts with; None: the prompts were raw text, so the
    export carries no template), generation_config.json, and under `adapter/`, if present, `base_model` (a
    local folder's absolute path or a hub id) as adapter_config.json's base_model_name_or_path. Returns the
    warnings also logged: what AutoTokenizer loads differently from `tokenizer`."""
    path = Path(path)
    write_tokenizer(path, tokenizer, chat_template)
    write_generation_config(path, tokenizer)
    adapter_config = path / ADAPTER_DIR / "adapter_config.json"
    if base_model is not None and adapter_config.is_file():
        config = json.loads(adapter_config.read_text())
        config["base_model_name_or_path"] = base_model_id(base_model)
        adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True))
    return check_auto_tokenizer(path, tokenizer)


def write_tokenizer(path: Path, tokenizer, chat_template: str | None) -> None:
    """tokenizer.json and tokenizer_config.json (class pinned), and the template in chat_template.jinja: the
    tokenizer's own templates as saved when `chat_template` is its default one, else only `chat_template`."""
    tokenizer.save_pretrained(str(path))
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = PINNED_TOKENIZER_CLASS
    for key in _LOAD_KEYS:
        config.pop(key, None)
    own = tokenizer.get_chat_template() if getattr(tokenizer, "chat_template", None) else None
    if chat_template is None or chat_template != own:  # none, or a template file: only what the prompts used
        config.pop("chat_template", None)
        (path / CHAT_TEMPLATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(path / "additional_chat_templates", ignore_errors=True)
        if chat_template is not None:
            (path / CHAT_TEMPLATE_FILE).write_text(chat_template)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))


def write_generation_config(path: Path, tokenizer) -> None:
    """generation_config.json (the exported one's other settings kept): the tokenizer's bos and pad ids (pad:
    EOS when it has none), and as EOS the tokenizer's, then config.json's (what the native rollout stops on)."""
    from transformers import GenerationConfig

    config_file = path / "config.json"  # absent here when the actor wrote it on another node's disk
    model_config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if (path / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(str(path))
    else:
        generation = GenerationConfig(**{k: model_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                                         if model_config.get(k) is not None})
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    declared = model_config.get("eos_token_id")
    for i in declared if isinstance(declared, list) else [] if declared is None else [declared]:
        if i not in eos:
            eos.append(i)
    if eos:
        generation.eos_token_id = eos[0] if len(eos) == 1 else eos
    if tokenizer.bos_token_id is not None:
        generation.bos_token_id = tokenizer.bos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else None)
    if pad is not None:
        generation.pad_token_id = pad
    generation.save_pretrained(str(path))


def check_auto_tokenizer(path: Path, tokenizer) -> list[str]:
    """What `AutoTokenizer.from_pretrained(path)` encodes or decodes differently from `tokenizer` (`PROBES`; a probe
    the run's tokenizer cannot represent, mapping some of it to its unknown token, says nothing and is skipped)."""
    import logging

    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(path))
    for text in PROBES:
        ours, theirs = tokenizer(text).input_ids, loaded(text).input_ids
        if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ours:
            continue
        if ours != theirs or loaded.decode(ours) != tokenizer.decode(ours):
            warning = (f"{path}: AutoTokenizer loads a {type(loaded).__name__} (transformers picks it for this "
                       f"model_type, whatever tokenizer_config.json says) that encodes {text!r} as {theirs[:12]}, "
                       f"the run's tokenizer as {ours[:12]}; load the tokenizer with "
                       f"transformers.PreTrainedTokenizerFast.from_pretrained({str(path)!r})")
            logging.getLogger(__name__).warning(warning)
            return [warning]
    return []
