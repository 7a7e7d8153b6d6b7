"""A smaller model of the same family and tokenizer: the first K decoder layers of a checkpoint, with its
embeddings, final norm and head. A student for on-policy distillation that starts from its teacher's lower layers
(examples/reasoning/config/opd_smollm2.yaml):

    python -m rlinf_like.models.truncate models/smollm2-135m-instruct models/smollm2-8l --layers 8
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")


def truncate(src: str | Path, dst: str | Path, layers: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    total = model.config.num_hidden_layers
    if not 0 < layers < total:
        raise ValueError(f"--layers {layers}: {src} has {total} decoder layers; keep between 1 and {total - 1}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    dst = Path(dst)
    model.save_pretrained(dst)
    for name in TOKENIZER_FILES:  # the very files: the student's ids are the teacher's
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, dst / name)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="an HF checkpoint folder")
    parser.add_argument("dst", help="where the smaller model is written")
    parser.add_argument("--layers", type=int, required=True, help="decoder layers to keep (the first ones)")
    args = parser.parse_args()
    print(f"wrote {truncate(args.src, args.dst, args.layers)}")


if __name__ == "__main__":
    main()
