"""IFEval's official instruction checkers, offline: lm-eval's copy of Google's `instruction_following_eval`
(`lm_eval.tasks.ifeval`, lm-eval 0.4.13), which pulls in langdetect, nltk and immutabledict.

Importing lm-eval's checkers asks nltk for its `punkt_tab` data and downloads it when it is missing, which this
machine cannot do. So the package's own Punkt parameters (`ifeval_data/nltk/`, see `ifeval_data/README.md`) are put
on nltk's search path *after* the user's: an installed `punkt_tab` wins. `length_constraints:number_sentences` reads
it, and `change_case:capital_word_frequency` through nltk's word tokenizer (which splits sentences first).
langdetect, which the language and case checkers call, is seeded, so a verdict does not change between calls.

`check(row, response)` scores one response the way lm-eval's `process_results` does: strict (the response as it is)
and loose (also without its first line, its last line or `*`s), per instruction and for the whole prompt.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "ifeval_data"
PROMPTS = DATA / "ifeval_input_data.jsonl"
_OUR_NLTK = DATA / "nltk"


@dataclass(frozen=True)
class Verdict:
    """One response's verdicts, per instruction in the row's order and for the prompt as a whole."""

    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)


def _missing() -> ValueError:
    return ValueError("the IFEval checkers need lm-eval, langdetect and immutabledict: "
                      "pip install 'lm-eval==0.4.13' langdetect immutabledict (scripts/setup.sh installs them)")


@functools.cache
def lm_eval_ifeval():
    """lm-eval's `tasks.ifeval.utils` module (its checkers), imported with nltk able to find Punkt parameters."""
    try:
        import nltk
    except ImportError as e:
        raise _missing() from e
    if str(_OUR_NLTK) not in nltk.data.path:
        nltk.data.path.append(str(_OUR_NLTK))  # after the user's folders: a real punkt_tab is found first
    try:
        import langdetect
        from lm_eval.tasks.ifeval import utils
    except ImportError as e:
        raise _missing() from e
    # langdetect samples: unseeded, the language checkers (english_capital, english_lowercase, response_language)
    # could give two verdicts on one response
    langdetect.DetectorFactory.seed = 0
    return utils


def punkt_source() -> str:
    """Which Punkt English parameters `number_sentences` uses: NLTK's, or this package's substitute."""
    import nltk

    lm_eval_ifeval()
    found = Path(str(nltk.data.find("tokenizers/punkt_tab/english/")))
    return "this package's substitute (ifeval_data/nltk)" if found.is_relative_to(_OUR_NLTK) else f"NLTK's ({found})"


def registry():
    """lm-eval's `instructions_registry` (the checker classes and their conflicts). Import lm-eval's ifeval modules
    through here or `lm_eval_ifeval`, never directly: the first import must find nltk's path set."""
    lm_eval_ifeval()
    from lm_eval.tasks.ifeval import instructions_registry

    return instructions_registry


def instruction_ids() -> list[str]:
    """Every instruction id the official checkers know, e.g. `punctuation:no_comma`."""
    return sorted(registry().INSTRUCTION_DICT)


def check(row: dict, response: str) -> Verdict:
    """`row` holds `prompt`, `instruction_id_list` and `kwargs` as in the official data."""
    out = lm_eval_ifeval().process_results(
        {"key": row.get("key", 0), "prompt": row["prompt"], "instruction_id_list": list(row["instruction_id_list"]),
         "kwargs": [dict(k) for k in row["kwargs"]]}, [response])
    return Verdict(strict=tuple(out["inst_level_strict_acc"]), loose=tuple(out["inst_level_loose_acc"]))


def official_prompts() -> list[dict]:
    """The 541 IFEval prompts (`data/ifeval_input_data.jsonl`), in the file's order."""
    return [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
