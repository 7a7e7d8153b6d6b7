"""Growing a conversation as tokens (`workers/rollout/agentic/chat_tokens.py`): the compact template for small models
and SmolLM2's own ChatML template, against what transformers renders for the whole conversation."""

import pytest

from rlinf_like.models.tiny import char_tokenizer
from rlinf_like.workers.rollout.agentic.chat_tokens import ChatTemplateError, ChatTokens

TEMPLATE = "examples/agentic/chat_template.jinja"
CALC = {"type": "function", "function": {"name": "calc", "description": "evaluates",
                                         "parameters": {"properties": {"expr": {}, "digits": {}}}}}
OPENING = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
CALL = '<tool_call>{"name":"calc","arguments":{"expr":"2+2"}}</tool_call>'


def test_the_compact_template_writes_short_roles_brief_tools_and_eos_after_every_turn():
    tok = char_tokenizer()
    template = open(TEMPLATE).read()
    messages = [*OPENING, {"role": "assistant", "content": None,
                           "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expr": "2+2"}}}]},
                {"role": "tool", "content": "4"}]
    text = tok.apply_chat_template(messages, tools=[CALC], chat_template=template, tokenize=False,
                                   add_generation_prompt=True)
    assert text == f"S:Be brief.\ntools: calc(expr,digits)<eos>U:2+2?<eos>A:{CALL}<eos>T:4<eos>A:"
    text = tok.apply_chat_template(messages[1:], tools=[CALC], chat_template=template, tokenize=False)
    assert text == f"S:tools: calc(expr,digits)<eos>U:2+2?<eos>A:{CALL}<eos>T:4<eos>"
    assert tok.apply_chat_template(messages[1:2], chat_template=template, tokenize=False) == "U:2+2?<eos>"
    ids = tok.apply_chat_template(messages[1:2], chat_template=template, tokenize=True, return_dict=False)
    assert ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids  # <eos> is the one token, the rest chars


def grown(chat: ChatTokens, tok, turns: list[str], answers: list[list[dict]]) -> list[int]:
    """The ids a rollout builds: the prompt, then each turn's model tokens (text + end-of-turn) and env tokens."""
    ids = chat.prompt_ids(OPENING)
    for text, messages in zip(turns, answers):
        ids += tok(text, add_special_tokens=False).input_ids + [chat.end_of_turn]
        ids += chat.env_ids(messages)
    return ids


def whole(tok, template, turns, answers, tools) -> list[int]:
    conversation = list(OPENING)
    for text, messages in zip(turns, answers):
        conversation += [{"role": "assistant", "content": text}, *messages]
    return list(tok.apply_chat_template(conversation, tools=tools, chat_template=template, tokenize=True,
                                        add_generation_prompt=True, return_dict=False))


TURNS = ["Let me compute.", "It is 4."]
ANSWERS = [[{"role": "tool", "content": "4"}], [{"role": "user", "content": "Sure?"}, {"role": "tool", "content": "yes"}]]


def test_env_tokens_are_the_render_difference_after_the_models_end_of_turn():
    tok = char_tokenizer()
    chat = ChatTokens(tok, TEMPLATE, [CALC])
    assert tok.decode(chat.env_ids(ANSWERS[0])) == "T:4<eos>A:"
    assert tok.decode(chat.env_ids(ANSWERS[0], after_end_of_turn=False)) == "<eos>T:4<eos>A:"  # stopped elsewhere
    assert tok.decode(chat.env_ids([])) == "A:"
    assert grown(chat, tok, TURNS, ANSWERS) == whole(tok, open(TEMPLATE).read(), TURNS, ANSWERS, [CALC])
    assert chat.text(tok("It is 4.<pad><eos>", add_special_tokens=False).input_ids) == "It is 4."


@pytest.mark.real_model
@pytest.mark.parametrize("template", [None, TEMPLATE])
def test_smollm2_chatml_and_the_compact_template_grow_as_the_whole_conversation_renders(real_model_path, template):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_path)
    chat = ChatTokens(tok, template, [CALC] if template else [])
    assert chat.end_of_turn == tok.convert_tokens_to_ids("<|im_end|>")
    expected = ("\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n" if template is None
                else "T:4<|im_end|>A:")  # ChatML: <|im_end|> is the model's, the newline after it the env's
    assert chat.env_ids(ANSWERS[0]) == tok(expected, add_special_tokens=False).input_ids
    text = None if template is None else open(template).read()
    assert grown(chat, tok, TURNS, ANSWERS) == whole(tok, text, TURNS, ANSWERS, [CALC] if template else None)


def test_templates_that_cannot_grow_as_tokens_are_refused_by_name():
    tok = char_tokenizer()
    # earlier assistant turns written differently (as templates that drop old reasoning do)
    rewrites = ("{% for m in messages %}{{ m.role[0] }}:{% if m.role == 'assistant' and not loop.last %}...{% else %}"
                "{{ m.content }}{% endif %}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    chat = ChatTokens(tok, rewrites)
    with pytest.raises(ChatTemplateError, match=r"the chat template given \(text\) renders an assistant turn "
                                                r"differently once messages follow it"):
        chat.env_ids([{"role": "tool", "content": "4"}])
    no_eos = "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    with pytest.raises(ChatTemplateError, match="does not end the assistant's turn with the tokenizer's eos_token"):
        ChatTokens(tok, no_eos)
    reopens = "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    with pytest.raises(ChatTemplateError, match="does not continue its generation prompt"):
        ChatTokens(tok, reopens)
