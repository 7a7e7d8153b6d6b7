"""Writes the search preset's tasks from the shipped question set (`search_qa.jsonl`, about the invented passages
of `rlinf_like/envs/tools/data/search_corpus.jsonl`, so no model can know the answers).

    python examples/agentic/data/make_search_tasks.py

Each row: `prompt` (the question), `answer` and `demo`, the assistant's side of a worked episode for the SFT
warm-start: a search for the entity the question names (the passage's title), then the answer. The tool's reply
comes from running the search itself during the warm-start. The last 50 questions are held out.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[2] / "rlinf_like" / "envs" / "tools" / "data" / "search_corpus.jsonl"


def main() -> None:
    # titles name the entity, some with a kind after it: "Skouthnond (river)"
    titles = [json.loads(line)["title"].split(" (")[0] for line in CORPUS.read_text().splitlines()]
    rows = []
    for line in (HERE / "search_qa.jsonl").read_text().splitlines():
        qa = json.loads(line)
        entity = max((t for t in titles if t in qa["question"]), key=len)  # the passage the question is about
        call = json.dumps({"name": "search", "arguments": {"query": entity}}, separators=(",", ":"))
        rows.append({"prompt": qa["question"], "answer": qa["answer"],
                     "demo": [f"<tool_call>{call}</tool_call>", f"\\boxed{{{qa['answer']}}}"]})
    for name, part in (("search_train.jsonl", rows[:-50]), ("search_test.jsonl", rows[-50:])):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in part))
        print(f"wrote {HERE / name}: {len(part)} rows")


if __name__ == "__main__":
    main()
