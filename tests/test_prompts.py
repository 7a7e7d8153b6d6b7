"""Prompt formatting (`data.chat_template`, `data.system_prompt`, `data.prompt_template`) with real
tokenizers and transformers' own `apply_chat_template`: a byte-level BPE tokenizer with ChatML special
tokens and template (trained in memory, saved and read back the way the runner reads a checkpoint), and
the tiny model's character tokenizer, which has no template."""

from pathlib import Path

import pytest

from rlinf_like.data.batch import build_sft_batch
from rlinf_like.data.config import DataConfig
from rlinf_like.data.prompts import PromptFormat
from rlinf_like.data.tasks import Problem
from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import char_tokenizer
from rlinf_like.workers.reward import score

EXAMPLE_TEMPLATE = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "chat_template.jinja"
CHATML = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
SYSTEM = "You add numbers."
PROBLEM = Problem(prompt="3+5-2=", answer="6", solution="3+5=8, 8-2=6. Answer: 6")


def bpe_tokenizer(path: Path, bos: bool = False):
    """A byte-level BPE tokenizer with `<|im_start|>` and `<|im_end|>` (its EOS) as special tokens and a
    ChatML template, written as a checkpoint's tokenizer files and read back with the runner's loader.
    `bos`: it also puts `<s>` before every text it encodes (as Llama's tokenizers do), and has no template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator([SYSTEM, PROBLEM.prompt + PROBLEM.solution, "system user assistant"] * 20, trainer)
    if bos:
        core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])
    extra = {"bos_token": "<s>"} if bos else {"chat_template": CHATML}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        **extra)
    tokenizer.save_pretrained(path)
    return load_tokenizer(path)


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return bpe_tokenizer(tmp_path_factory.mktemp("chatml"))


def fmt(tokenizer, **data) -> PromptFormat:
    return PromptFormat(tokenizer, DataConfig(**data))


def test_auto_applies_the_tokenizers_template_with_the_system_prompt(chatml):
    assert chatml.chat_template == CHATML  # it survived save_pretrained / load_tokenizer
    f = fmt(chatml, system_prompt=SYSTEM)
    text = f.text(PROBLEM)
    assert text == ("<|im_start|>system\nYou add numbers.<|im_end|>\n"
                    "<|im_start|>user\n3+5-2=<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = f.prompt_ids(PROBLEM)
    assert ids == chatml(text, add_special_tokens=False).input_ids and chatml.decode(ids) == text
    im_start = chatml.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(im_start) == 3 and ids[0] == im_start  # written as the special token, not spelled out
    assert f.describe(PROBLEM) == f"({len(ids)} tokens, data.chat_template=auto):\n{text}"
    assert fmt(chatml).text(PROBLEM) == "<|im_start|>user\n3+5-2=<|im_end|>\n<|im_start|>assistant\n"


def test_none_gives_raw_text(chatml):
    f = fmt(chatml, chat_template="none", system_prompt=SYSTEM)
    assert f.text(PROBLEM) == "You add numbers.\n3+5-2="
    assert f.prompt_ids(PROBLEM) == chatml("You add numbers.\n3+5-2=").input_ids
    assert fmt(chatml, chat_template="none").text(PROBLEM) == "3+5-2="
    assert f.describe(PROBLEM).endswith(", data.chat_template=none, no template: raw text):\nYou add numbers.\n3+5-2=")


def test_a_template_file_is_used_instead_of_the_tokenizers(chatml, tmp_path):
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
                    "{% if add_generation_prompt %}### assistant: {% endif %}")
    f = fmt(chatml, chat_template=str(path), system_prompt=SYSTEM)
    assert f.text(PROBLEM) == "### system: You add numbers.\n### user: 3+5-2=\n### assistant: "


def test_without_a_template_auto_falls_back_to_raw_text_the_system_prompt_on_its_own_line():
    tok = char_tokenizer()
    assert not tok.chat_template
    f = fmt(tok, system_prompt=SYSTEM)
    assert f.template is None and f.text(PROBLEM) == "You add numbers.\n3+5-2="
    assert f.describe(PROBLEM) == ("(23 tokens, data.chat_template=auto, no template: raw text):\n"
                                   "You add numbers.\n3+5-2=")
    assert fmt(tok).text(PROBLEM) == "3+5-2="
    tab = Problem(prompt="3\t+5=", answer="8")  # a tab is not in the character vocabulary
    assert fmt(tok).describe(tab).startswith("(5 tokens, 1 of them unknown to the tokenizer, data.chat_template=auto")


def test_the_example_template_with_the_character_tokenizer():
    """examples/reasoning/chat_template.jinja is ChatML spelled in characters the tiny model's tokenizer knows."""
    tok = char_tokenizer()
    f = fmt(tok, chat_template=str(EXAMPLE_TEMPLATE), system_prompt=SYSTEM)
    text = "<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\n3+5-2=<|im_end|>\n<|im_start|>assistant\n"
    assert f.text(PROBLEM) == text
    ids = f.prompt_ids(PROBLEM)
    assert len(ids) == len(text) and tok.unk_token_id not in ids and tok.decode(ids) == text
    assert f.describe(PROBLEM) == f"({len(text)} tokens, data.chat_template={EXAMPLE_TEMPLATE}):\n{text}"


def test_prompt_template_fills_the_prompt_and_the_rows_columns():
    tok = char_tokenizer()
    row = Problem(prompt="What is 2+3?", answer="5", fields={"question": "What is 2+3?", "level": "easy"})
    f = fmt(tok, prompt_template="[{level}] {question}\nPut the final answer in \\boxed{{}}.")
    assert f.text(row) == "[easy] What is 2+3?\nPut the final answer in \\boxed{}."
    assert fmt(tok, prompt_template="Q: {prompt}").text(row) == "Q: What is 2+3?"
    with pytest.raises(ValueError, match=r"data.prompt_template='\{nope\}' names 'nope', which is neither \{prompt\} "
                                         r"nor a column of the data \(\['level', 'question'\]\)"):
        fmt(tok, prompt_template="{nope}").text(row)
    with pytest.raises(ValueError, match=r"data.prompt_template='\\\\boxed\{\}'.*literal brace"):
        fmt(tok, prompt_template="\\boxed{}").text(row)  # `{}` is a positional field
    with pytest.raises(ValueError, match=r"data.prompt_template='\{prompt'.*literal brace"):
        fmt(tok, prompt_template="{prompt").text(row)


def test_chat_problems_keep_their_history_and_one_system_message(chatml):
    turns = ({"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
             {"role": "user", "content": "2+2="})
    chat = Problem(prompt="2+2=", answer="4", solution="Answer: 4", messages=turns)
    f = fmt(chatml, system_prompt=SYSTEM, prompt_template="{prompt} Be brief.")
    assert f.messages(chat) == [{"role": "system", "content": SYSTEM}, turns[0], turns[1],
                                {"role": "user", "content": "2+2= Be brief."}]
    assert f.text(chat) == ("<|im_start|>system\nYou add numbers.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n"
                            "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\n2+2= Be brief.<|im_end|>\n"
                            "<|im_start|>assistant\n")
    own = Problem(prompt="2+2=", answer="4", messages=({"role": "system", "content": "Be exact."}, *turns))
    assert [m["role"] for m in f.messages(own)] == ["system", "user", "assistant", "user"]
    assert f.text(own).count("system") == 1 and f.text(own).startswith("<|im_start|>system\nBe exact.<|im_end|>")


def test_sft_target_is_the_assistant_turn_through_eos(chatml):
    """The template ends the turn with `<|im_end|>`, the tokenizer's EOS: the target is the answer and that
    token, not the newline the template writes after it, and the loss mask covers exactly those tokens."""
    f = fmt(chatml, system_prompt=SYSTEM)
    other = Problem(prompt="7-4=", answer="3", solution="Answer: 3")
    pairs = [f.sft_ids(PROBLEM), f.sft_ids(other)]
    for p, (prompt, target) in zip([PROBLEM, other], pairs):
        assert prompt == f.prompt_ids(p)
        assert target[-1] == chatml.eos_token_id and target.count(chatml.eos_token_id) == 1
        assert chatml.decode(target) == p.solution + "<|im_end|>"
        assert chatml.decode(prompt + target) == f.text(p) + p.solution + "<|im_end|>"
    batch = build_sft_batch(*zip(*pairs), pad_id=chatml.pad_token_id)
    for row, (prompt, target) in enumerate(pairs):
        mask = batch["loss_mask"][row].bool()
        assert batch["input_ids"][row][mask].tolist() == target  # the assistant's tokens, nothing else
        assert mask.nonzero().flatten().tolist() == list(range(len(prompt), len(prompt) + len(target)))
        masked = chatml.decode(batch["input_ids"][row][mask].tolist())
        assert SYSTEM not in masked and "user" not in masked and "assistant" not in masked


def test_sft_target_when_the_templates_end_of_turn_is_not_the_eos_token():
    """The character tokenizer spells `<|im_end|>` out in characters and ends with its own `<eos>`: the
    target is the answer and `<eos>`, so the decoded response (what the reward reads) is the answer alone."""
    tok = char_tokenizer()
    f = fmt(tok, chat_template=str(EXAMPLE_TEMPLATE), system_prompt=SYSTEM)
    prompt, target = f.sft_ids(PROBLEM)
    assert prompt == f.prompt_ids(PROBLEM)
    assert target == tok(PROBLEM.solution).input_ids + [tok.eos_token_id]
    response = tok.decode(target, skip_special_tokens=True)
    assert response == PROBLEM.solution
    assert score(response, PROBLEM.answer, finished=True, num_tokens=len(target)).correct


def test_sft_raw_text_is_the_solution_and_eos_as_before(chatml, tmp_path):
    """Without a template: the prompt as `tokenizer(prompt)` gives it and the solution's tokens + EOS, what
    the runner did before prompt formatting (the golden runs depend on it); no BOS inside the target."""
    tok = char_tokenizer()
    prompt, target = fmt(tok).sft_ids(PROBLEM)
    assert prompt == tok(PROBLEM.prompt).input_ids and target == tok(PROBLEM.solution).input_ids + [tok.eos_token_id]
    llama_like = bpe_tokenizer(tmp_path / "bos", bos=True)
    bos = llama_like.bos_token_id
    prompt, target = fmt(llama_like).sft_ids(PROBLEM)
    assert prompt[0] == bos and prompt == llama_like(PROBLEM.prompt).input_ids
    assert bos not in target and llama_like.decode(target) == PROBLEM.solution + "<|im_end|>"


def test_a_template_that_renders_the_prompt_differently_once_answered_is_refused(chatml, tmp_path):
    path = tmp_path / "thinking.jinja"  # opens an empty thought in the generation prompt only
    path.write_text(CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think></think>'"))
    with pytest.raises(ValueError, match="renders the conversation with the answer differently"):
        fmt(chatml, chat_template=str(path)).sft_ids(PROBLEM)
