"""How a problem becomes the tokens the model sees (`data.chat_template`, `data.system_prompt`,
`data.prompt_template`), for RL prompts, evaluation and the SFT warm-start alike.

The user message is `data.prompt_template` filled with the problem's prompt (`{prompt}`) and its row's
columns by name. With a chat template (the tokenizer's own under `auto`, or a Jinja file), the messages
(system prompt, the row's earlier turns, the user message) are rendered with `add_generation_prompt=True`.
Without one, the user message is used raw, the system prompt on its own line before it (a chat row's earlier
turns need a template). SFT targets are what the template writes for the assistant's answer, ending with
EOS, so the loss covers the assistant part only. `describe` is the start-up log's view of a prompt.
"""

from __future__ import annotations

from pathlib import Path

from rlinf_like.data.tasks import Problem

_MARK = "ANSWER_MARK_5e1f"  # stands in for the answer to find where a template puts it (no whitespace to strip)


class PromptFormat:
    def __init__(self, tokenizer, cfg):
        """`cfg`: the `data` section."""
        self.tokenizer, self.cfg = tokenizer, cfg
        if cfg.chat_template == "none":
            self.template = None
        elif cfg.chat_template == "auto":  # a tokenizer with several named templates: its default one
            self.template = tokenizer.get_chat_template() if getattr(tokenizer, "chat_template", None) else None
        else:
            self.template = Path(cfg.chat_template).read_text()

    def prepare_sft(self, problems) -> None:
        """Nothing to compute ahead: a single-turn SFT row is its prompt and solution."""

    def user_message(self, p: Problem) -> str:
        return user_message(self.cfg, p)

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

    def describe(self, p: Problem) -> str:
        """How `p` reaches the model, for the start-up log (where users debug their templates): its token
        count, the template in use, the tokens the tokenizer does not know, and the text."""
        ids = self.prompt_ids(p)
        unknown = ids.count(self.tokenizer.unk_token_id) if self.tokenizer.unk_token_id is not None else 0
        return (f"({len(ids)} tokens{f', {unknown} of them unknown to the tokenizer' if unknown else ''}, "
                f"data.chat_template={self.cfg.chat_template}{'' if self.template else ', no template: raw text'}"
                f"):\n{self.text(p)}")

    def sft_ids(self, p: Problem) -> tuple[list[int], list[int]]:
        """(prompt ids, target ids) for the warm-start: the target is the solution as the assistant's turn,
        ending with EOS, where generation stops. When the template ends the turn with the tokenizer's EOS
        token, the target ends there (what the template writes after it, a newline, is never generated);
        otherwise the EOS takes the place of the template's end-of-turn text (text such as `<|im_end|>` that
        the tokenizer spells out in ordinary tokens would otherwise end up in the decoded answer)."""
        prompt = self.prompt_ids(p)
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no EOS token, so an SFT target cannot end; give it an eos_token")
        if self.template is None:
            return prompt, self._encode(p.solution) + [eos]
        messages, rendered = self.messages(p), self.text(p)
        marked = self._assistant_turn(messages, rendered, _MARK)
        before, _, after = marked.partition(_MARK)
        turn = self._assistant_turn(messages, rendered, p.solution)
        if marked.count(_MARK) != 1 or not (turn.startswith(before) and turn.endswith(after)
                                            and len(turn) >= len(before) + len(after)):
            raise ValueError(f"data.chat_template={self.cfg.chat_template!r} writes the assistant's turn differently "
                             f"around different answers, so the answer cannot be cut out as the SFT target; use "
                             f"data.chat_template=none or another template file")
        target = self._encode(turn)
        if eos in target:
            return prompt, target[: target.index(eos) + 1]
        return prompt, self._encode(turn[: len(turn) - len(after)]) + [eos]

    def _assistant_turn(self, messages: list[dict], rendered: str, content: str) -> str:
        """What the template writes after the prompt `rendered` for an assistant turn holding `content`."""
        full = self.tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": content}],
                                                  chat_template=self.template, tokenize=False)
        if not full.startswith(rendered):
            raise ValueError(f"data.chat_template={self.cfg.chat_template!r} renders the conversation with the "
                             f"answer differently from the prompt alone, so the assistant part cannot be cut out; "
                             f"use data.chat_template=none or another template file")
        return full[len(rendered):]

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)


def user_message(cfg, p: Problem) -> str:
    """`data.prompt_template` filled with the problem's prompt and its row's columns (`cfg`: the data section)."""
    try:
        return cfg.prompt_template.format(**{**p.fields, "prompt": p.prompt})
    except KeyError as e:
        raise ValueError(f"data.prompt_template={cfg.prompt_template!r} names {e}, which is neither "
                         f"{{prompt}} nor a column of the data ({sorted(p.fields)}); write a literal brace "
                         f"as {{{{ or }}}}") from e
    except (IndexError, ValueError) as e:  # `{}` or `{0}`, an unmatched brace
        raise ValueError(f"data.prompt_template={cfg.prompt_template!r}: {e}; placeholders are {{prompt}} "
                         f"and the data's columns ({sorted(p.fields)}) by name; write a literal brace as "
                         f"{{{{ or }}}}") from e
