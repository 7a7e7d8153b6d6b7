"""How a problem becomes the tokens the model sees (`data.chat_template`, `data.system_prompt`,
`data.prompt_template`), for RL prompts, evaluation and the SFT warm-start alike.

The user message is `data.prompt_template` filled with the problem's prompt (`{prompt}`) and its row's
columns by name. With a chat template (the tokenizer's own under `auto`, or a Jinja file), the messages
(system prompt, the row's earlier turns, the user message) are rendered with `add_generation_prompt=True`.
Without one, the text is used raw, the system prompt on its own line before it. SFT targets are what the
template adds for the assistant's answer, so the loss covers the assistant part only.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_like.data.tasks import Problem


class PromptFormat:
    def __init__(self, tokenizer, cfg):
        """`cfg`: the `data` section."""
        self.tokenizer, self.cfg = tokenizer, cfg
        if cfg.chat_template == "none":
            self.template = None
        elif cfg.chat_template == "auto":
            self.template = getattr(tokenizer, "chat_template", None) or None
        else:
            self.template = Path(cfg.chat_template).read_text()

    def user_message(self, p: Problem) -> str:
        try:
            return self.cfg.prompt_template.format(**{**p.fields, "prompt": p.prompt})
        except (KeyError, IndexError) as e:
            raise ValueError(f"data.prompt_template={self.cfg.prompt_template!r} names {e}, which is neither "
                             f"{{prompt}} nor a column of the data ({sorted(p.fields)}); write a literal brace "
                             f"as {{{{ or }}}}") from e

    def messages(self, p: Problem) -> list[dict]:
        history = [dict(m) for m in p.messages[:-1]] if p.messages else []
        out = history + [{"role": "user", "content": self.user_message(p)}]
        if self.cfg.system_prompt and out[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": self.cfg.system_prompt})
        return out

    def text(self, p: Problem) -> str:
        """The rendered prompt, as the model sees it."""
        if self.template is None:
            user = self.user_message(p)
            return f"{self.cfg.system_prompt}\n{user}" if self.cfg.system_prompt else user
        return self.tokenizer.apply_chat_template(self.messages(p), chat_template=self.template, tokenize=False,
                                                  add_generation_prompt=True)

    def prompt_ids(self, p: Problem) -> list[int]:
        if self.template is None:
            return list(self.tokenizer(self.text(p)).input_ids)
        return self._encode(self.text(p))  # the template writes its own special tokens

    def sft_ids(self, p: Problem) -> tuple[list[int], list[int]]:
        """(prompt ids, target ids) for the warm-start: the target is the solution as the assistant's turn,
        ending with EOS (the template's end-of-turn token when that is the tokenizer's EOS)."""
        prompt = self.prompt_ids(p)
        eos = self.tokenizer.eos_token_id
        if self.template is None:
            return prompt, self._encode_plain(p.solution) + [eos]
        rendered = self.text(p)
        full = self.tokenizer.apply_chat_template(self.messages(p) + [{"role": "assistant", "content": p.solution}],
                                                  chat_template=self.template, tokenize=False)
        if not full.startswith(rendered):
            raise ValueError("the chat template renders the conversation with the answer differently from the prompt "
                             "alone, so the assistant part cannot be cut out; use data.chat_template=none or a "
                             "template file")
        target = self._encode(full[len(rendered):])
        if eos in target:
            target = target[: target.index(eos) + 1]  # what follows EOS (a newline) is never generated
        else:
            target.append(eos)
        return prompt, target

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _encode_plain(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)
