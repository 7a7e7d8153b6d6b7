"""The `search` tool: BM25 (the `bm25s` library) over a local JSONL corpus of {"id", "title", "text"} passages.

An index is built once per process and corpus path, then shared by every tool instance (a rollout builds one
environment, and so one tool, per sample).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s

from rlinf_like.envs.tools.base import OPTIONS_KEY, Tool, ToolOptions


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class CorpusIndex:
    passages: tuple[Passage, ...]
    retriever: bm25s.BM25

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """The best `k` passages with a positive score, best first (none when no query word is in the corpus)."""
        tokens = _tokenize([query], return_ids=False)
        if not tokens[0]:
            return []
        ids, scores = self.retriever.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False)
        return [(self.passages[i], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


_INDEXES: dict[Path, CorpusIndex] = {}
_INDEXES_LOCK = threading.Lock()  # envs may be built from several threads; build each index once


def corpus_index(path: str | Path) -> CorpusIndex:
    """The index of a corpus file, built on first use and cached per resolved path."""
    key = Path(path).resolve()
    with _INDEXES_LOCK:
        if key not in _INDEXES:
            passages = load_passages(key)
            retriever = bm25s.BM25()
            retriever.index(_tokenize([f"{p.title} {p.text}" for p in passages]), show_progress=False)
            _INDEXES[key] = CorpusIndex(passages=passages, retriever=retriever)
        return _INDEXES[key]


def load_passages(path: Path) -> tuple[Passage, ...]:
    if not path.is_file():
        raise ValueError(f"{OPTIONS_KEY}.search_corpus={str(path)!r}: no such file")
    passages = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not all(isinstance(row.get(key), str) for key in ("id", "title", "text")):
            raise ValueError(f"{path}:{line_no}: a passage needs string fields 'id', 'title', 'text', got {row}")
        passages.append(Passage(id=row["id"], title=row["title"], text=row["text"]))
    if not passages:
        raise ValueError(f"{OPTIONS_KEY}.search_corpus={str(path)!r}: the corpus has no passages")
    return tuple(passages)


def _tokenize(texts: list[str], return_ids: bool = True) -> Any:
    return bm25s.tokenize(texts, stopwords="en", return_ids=return_ids, show_progress=False)


class SearchTool(Tool):
    name = "search"
    description = "Search a knowledge base and return the most relevant passages, each as 'title: text'."
    parameters = {"type": "object",
                  "properties": {"query": {"type": "string", "description": "what to look for, in a few words"}},
                  "required": ["query"]}

    def __init__(self, options: ToolOptions):
        super().__init__(options)
        self.index = corpus_index(options.search_corpus)  # now, so a bad path fails when the env is built

    def run(self, arguments: dict[str, Any]) -> str:
        query = self.string_argument(arguments, "query")
        hits = self.index.search(query, self.options.search_top_k)
        if not hits:
            return f"no passage matches {query!r}; try other words"
        # each passage gets an equal share of the output, so all k stay visible
        share = max(self.options.max_output_chars // len(hits) - 2, 20)
        return "\n\n".join(_cut(f"{p.title}: {p.text}", share) for p, _ in hits)


def _cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars - 3] + "..."
