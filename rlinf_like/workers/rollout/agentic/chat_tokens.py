"""A conversation as token ids, grown turn by turn without re-tokenizing what the model wrote.

The model's tokens go into the trajectory as generated. What the environment answers is rendered through the
chat template and appended as tokens: the ids of the new messages plus the next assistant generation prompt are
the difference of two renderings of a fixed dummy conversation, one ending with an assistant turn and one with
the new messages after it. The cut is just after the template's end-of-turn token (the tokenizer's EOS, which
the model generates), so what a template writes after it belongs to the environment's tokens: ChatML's
`<|im_end|>` is the model's, the `\\n` after it the environment's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlinf_like.envs.text import Message

# a conversation that stands in for the real one: templates render the messages after an assistant turn alike
_OPENING: list[Message] = [{"role": "user", "content": "x"}]
_ANSWER: Message = {"role": "assistant", "content": "y"}


class ChatTemplateError(ValueError):
    """The chat template cannot be grown turn by turn as tokens."""


def read_template(chat_template: str | None) -> tuple[str | None, str]:
    """(template text or None for the tokenizer's own, its name for errors); a `.jinja` path is read."""
    if chat_template is None:
        return None, "the tokenizer's chat template"
    if chat_template.endswith(".jinja") and Path(chat_template).is_file():
        return Path(chat_template).read_text(), f"chat template {chat_template}"
    return chat_template, "the chat template given (text)"


class ChatTokens:
    """Token ids of a conversation's pieces under one tokenizer, template and tool list."""

    def __init__(self, tokenizer, chat_template: str | None, tools: Sequence[dict] = ()):
        self.tokenizer = tokenizer
        self.template, self.name = read_template(chat_template)
        self.tools = list(tools) or None
        self.end_of_turn: int = tokenizer.eos_token_id
        if self.end_of_turn is None:
            raise ChatTemplateError("the tokenizer has no eos_token, so a model turn cannot end; give it one")
        opening = self.render(_OPENING, add_generation_prompt=True)
        closed = self.render([*_OPENING, _ANSWER], add_generation_prompt=False)
        if closed[: len(opening)] != opening:
            raise ChatTemplateError(f"{self.name} writes an assistant turn that does not continue its generation "
                                    f"prompt, so the model's tokens cannot be appended to the prompt as they are")
        turn = closed[len(opening):]
        if self.end_of_turn not in turn:
            raise ChatTemplateError(f"{self.name} does not end the assistant's turn with the tokenizer's eos_token "
                                    f"{tokenizer.eos_token!r}, the token the model's turn stops at")
        self._cut = len(closed) - turn[::-1].index(self.end_of_turn)  # just after the assistant's end-of-turn
        self._closed = closed[: self._cut]

    def render(self, messages: list[Message], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tools=self.tools, chat_template=self.template,
                                                 add_generation_prompt=add_generation_prompt, tokenize=True,
                                                 return_dict=False)
        return list(ids)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The opening messages with the assistant's generation prompt."""
        return self.render(messages, add_generation_prompt=True)

    def env_ids(self, messages: list[Message], after_end_of_turn: bool = True) -> list[int]:
        """The ids that follow a model turn ending with the end-of-turn token: `messages` and the next generation
        prompt. A turn that stopped elsewhere (a stop string) gets the end-of-turn token first."""
        full = self.render([*_OPENING, _ANSWER, *messages], add_generation_prompt=True)
        if full[: self._cut] != self._closed:
            at = next((i for i, (a, b) in enumerate(zip(full, self._closed)) if a != b), len(full))
            raise ChatTemplateError(
                f"{self.name} renders an assistant turn differently once messages follow it (token {at} of "
                f"{self._cut} differs: {self.tokenizer.decode(self._closed[at:])!r} became "
                f"{self.tokenizer.decode(full[at:self._cut])!r}), so the trajectory cannot grow as tokens")
        return full[self._cut - (not after_end_of_turn):]

    def text(self, model_ids: list[int]) -> str:
        """What the model wrote in a turn, for the environment: without its end-of-turn and special tokens."""
        if model_ids and model_ids[-1] == self.end_of_turn:
            model_ids = model_ids[:-1]
        return self.tokenizer.decode(model_ids, skip_special_tokens=True)
