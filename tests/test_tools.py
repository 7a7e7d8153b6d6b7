"""The agent's tools, run for real: the python sandbox in a limited subprocess, the calculator's expression
walker, BM25 search over the shipped synthetic corpus, and the registry that builds them from config names."""

import json
import os
import tempfile
import re
import time
from pathlib import Path

import pytest

from rlinf_like.envs.tools import TOOLS, ToolOptions, build_tools
from rlinf_like.envs.tools.base import NOTE_ROOM, SHIPPED_CORPUS
from rlinf_like.envs.tools.data import make_corpus
from rlinf_like.envs.tools.python_sandbox import FILE_LIMIT_BYTES
from rlinf_like.envs.tools.search import corpus_index

ROOT = Path(__file__).resolve().parents[1]
QA_PATH = ROOT / "examples" / "agentic" / "data" / "search_qa.jsonl"


def tool(name, **options):
    return build_tools([name], ToolOptions(**options))[name]


def alive(pid: int) -> bool:
    """A zombie (killed, not yet reaped by its new parent) counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# --- registry and options ---------------------------------------------------------------------------------------

def test_build_tools_by_name_and_refuses_unknown_or_repeated_names():
    tools = build_tools(["calculator", "python"], ToolOptions())
    assert list(tools) == ["calculator", "python"] and TOOLS.names() == ["calculator", "python", "search"]
    with pytest.raises(ValueError, match=re.escape("agent.tools='shell' is not one of ['calculator', 'python', "
                                                   "'search']")):
        build_tools(["calculator", "shell"], ToolOptions())
    with pytest.raises(ValueError, match="agent.tools lists 'python' twice"):
        build_tools(["python", "python"], ToolOptions())


def test_options_are_keyword_only_and_checked():
    with pytest.raises(TypeError):
        ToolOptions(5.0)
    with pytest.raises(ValueError, match=r"agent.tool_options.timeout_s=0 must be > 0"):
        ToolOptions(timeout_s=0)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['timeout'\]; allowed: \['timeout_s', "):
        ToolOptions.from_mapping({"timeout": 3})
    assert ToolOptions.from_mapping({"search_top_k": 1}) == ToolOptions(search_top_k=1)
    assert ToolOptions().search_corpus == str(SHIPPED_CORPUS)


def test_schema_is_the_openai_function_format():
    assert tool("calculator").schema() == {
        "type": "function",
        "function": {"name": "calculator",
                     "description": "Evaluate an arithmetic expression exactly, e.g. (3 + 4) * 12 / 7. "
                                    "Allowed: numbers and + - * / // % ** ( ).",
                     "parameters": {"type": "object",
                                    "properties": {"expression": {"type": "string",
                                                                  "description": "the expression to evaluate"}},
                                    "required": ["expression"]}}}


# --- python -----------------------------------------------------------------------------------------------------

def test_python_runs_code_and_returns_its_output():
    python = tool("python")
    assert python.call({"code": "print(2+3)"}).text == "5\n"
    assert python.call({"code": "x = 1"}).text == "(no output: print() the values you want to see)"
    bad = python.call({"code": 7})
    assert (bad.status, bad.text) == ("error", "error: python needs a non-empty string argument 'code', "
                                               "got arguments {'code': 7}")


def test_python_infinite_loop_times_out_and_its_process_group_is_killed():
    python = tool("python", timeout_s=1.0)
    code = ("import os, time\nprint(os.getpid(), flush=True)\n"
            "try:\n    child = os.fork()\n    if child == 0:\n        time.sleep(60)\n    print(child, flush=True)\n"
            "except OSError:\n    pass  # RLIMIT_NPROC refuses the fork (not for root)\nwhile True:\n    pass\n")
    start = time.monotonic()
    result = python.call({"code": code})
    elapsed = time.monotonic() - start
    assert result.status == "timeout" and 1.0 <= elapsed < 2.0
    assert result.text.startswith("error: the code timed out after 1 s and was stopped; its output:\n")
    pids = [int(p) for p in result.text.split("its output:\n")[1].split()]
    time.sleep(0.1)  # the forked child's SIGKILL is delivered asynchronously
    assert pids and not any(alive(pid) for pid in pids)


def test_python_cpu_limit():
    result = tool("python", timeout_s=5.0, python_cpu_s=1).call({"code": "while True:\n    pass"})
    assert (result.status, result.text) == ("error", "error: the code used its CPU time limit of 1 s and was stopped")


def test_python_memory_bomb_hits_the_address_space_limit():
    for bomb in ("x = bytearray(10**9)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"):
        result = tool("python", python_memory_mb=128).call({"code": bomb})
        assert result.status == "error", result
        assert result.text.startswith("error: the code exited with status 1 (memory limit: 128 MB); its output:\n"
                                      "Traceback (most recent call last):\n  File \"main.py\", line ")
        assert result.text.endswith("MemoryError\n")


def test_python_crash_shows_the_traceback_with_the_middle_cut():
    result = tool("python", max_output_chars=300).call(
        {"code": "print('x' * 5000)\nraise ValueError('the end')"})
    assert result.status == "error"
    head, tail = result.text.split("\n... [truncated: ")
    assert head == "error: the code exited with status 1; its output:\n" + "x" * 128
    total = 5001 + len('Traceback (most recent call last):\n  File "main.py", line 2, in <module>\n'
                       "    raise ValueError('the end')\nValueError: the end\n")
    assert tail.startswith(f"{total} bytes of output in all; its middle is cut] ...\n")
    assert tail.endswith("\nValueError: the end\n") and len(result.text) <= 300 + NOTE_ROOM


def test_python_output_flood_is_stopped_at_the_file_limit_and_truncated():
    start = time.monotonic()
    result = tool("python", timeout_s=5.0).call({"code": "while True:\n    print('x' * 1000)"})
    assert time.monotonic() - start < 2.0  # stopped by RLIMIT_FSIZE, not by the timeout
    assert result.status == "error" and len(result.text) <= 1000 + NOTE_ROOM
    assert (f"\n... [truncated: {FILE_LIMIT_BYTES} bytes of output in all; the output limit, the program was "
            "stopped there; its middle is cut] ...\n") in result.text


def test_python_sees_no_inherited_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_secret_value")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")  # -I ignores PYTHON* anyway
    code = "import os, sys\nprint(sorted(os.environ))\nprint('/nowhere' in sys.path)"
    text = tool("python").call({"code": code}).text
    assert text == ("['HOME', 'LANG', 'LC_ALL', 'MKL_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', "
                    "'PATH', 'TMPDIR']\nFalse\n")


def test_python_works_in_a_temporary_directory_removed_after_the_call():
    text = tool("python").call({"code": "import os\nopen('notes.txt', 'w').write('hi')\nprint(os.getcwd())"}).text
    workdir = Path(text.strip())
    assert workdir.name == "work" and workdir.parent.name.startswith("rlinf-python-")
    assert not workdir.parent.exists()


# --- calculator ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("expression, expected", [
    ("123*45", "5535"), ("-(3 + 4) * 2", "-14"), ("7 // 2", "3"), ("-7 % 3", "2"), ("2 ** 10", "1024"),
    ("10 / 4", "2.5"), ("10 / 2", "5"), ("0.1 + 0.2", "0.3"), ("1 / 3", "0.333333333333"), ("2 ** -1", "0.5"),
    ("123456789 * 987654321", "121932631112635269"), ("1_000 * 3", "3000"), ("2 ** 0.5", "1.41421356237"),
    ("1/0", "error: division by zero"), ("5 % 0", "error: division by zero"), ("0 ** -1", "error: division by zero"),
    ("9 ** 9 ** 9", "error: the result would have more than 1023 digits"),
    ("(10 ** 1000) * (10 ** 1000)", "error: the result would have more than 1023 digits"),
    ("1e308 * 10", "error: the result is too large"), ("10 ** 400 / 3", "error: the result is too large"),
    ("x + 1", "error: only numbers and + - * / // % ** ( ) are allowed, not the name 'x'"),
    ("__import__('os').system('ls')", "error: only numbers and + - * / // % ** ( ) are allowed, not a function call"),
    ("(1).real", "error: only numbers and + - * / // % ** ( ) are allowed, not an attribute"),
    ("abs(-1)", "error: only numbers and + - * / // % ** ( ) are allowed, not a function call"),
    ("2 ^ 3", "error: only numbers and + - * / // % ** ( ) are allowed, not the operator BitXor (use ** for powers)"),
    ("True + 1", "error: only numbers and + - * / // % ** ( ) are allowed, not the constant True"),
    ("(1 + 2", "error: invalid expression; use numbers and + - * / // % ** ( )"),
    ("1+" * 300 + "1", "error: the expression is longer than 500 characters"),
])
def test_calculator(expression, expected):
    result = tool("calculator").call({"expression": expression})
    assert result.text == expected and result.status == ("error" if expected.startswith("error") else "ok")


# --- search ---------------------------------------------------------------------------------------------------------

def test_search_returns_the_top_k_passages_as_title_and_text():
    text = tool("search", search_top_k=2).call({"query": "who founded the town of Tysktril"}).text
    first, second = text.split("\n\n")
    assert first == ("Tysktril: Tysktril is a market town in the Fennagh lowlands. It was founded in 1300 by a cooper "
                     "named Stelan. The town is famous for a honey pastry called Skosnerrom, which is baked for its "
                     "yearly lantern fair.")
    assert second.startswith(("Lake ", "Mount ")) or " town " in second  # some other passage, ranked lower
    cut = tool("search", search_top_k=2, max_output_chars=100).call({"query": "Tysktril town"}).text
    assert cut.split("\n\n")[0] == "Tysktril: Tysktril is a market town in the Fe..."  # 100 // 2 - 2 chars
    assert tool("search").call({"query": "the of"}).text == "no passage matches 'the of'; try other words"


def test_search_index_is_built_once_per_corpus_path(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(
        [("Apples", "Apples grow on trees."), ("Rivers", "Rivers flow to the sea."), ("Pears", "Pears are sweet.")])))
    a, b = tool("search", search_corpus=str(corpus)), tool("search", search_corpus=str(tmp_path / "." / corpus.name))
    assert a.index is b.index is corpus_index(corpus)
    assert a.call({"query": "where do rivers flow"}).text == "Rivers: Rivers flow to the sea."
    with pytest.raises(ValueError, match=r"agent.tool_options.search_corpus='/no/such.jsonl': no such file"):
        tool("search", search_corpus="/no/such.jsonl")


def test_shipped_corpus_and_questions_match_their_generator():
    passages, questions = make_corpus.build()
    assert SHIPPED_CORPUS.read_text() == "".join(json.dumps(p) + "\n" for p in passages)
    assert QA_PATH.read_text() == "".join(json.dumps(q) + "\n" for q in questions)
    assert len(passages) == len(questions) == 300 and len({p["id"] for p in passages}) == 300


def test_every_question_has_its_answer_in_exactly_one_passage_and_bm25_ranks_it_first():
    passages = [json.loads(line) for line in SHIPPED_CORPUS.read_text().splitlines()]
    questions = [json.loads(line) for line in QA_PATH.read_text().splitlines()]
    index = corpus_index(SHIPPED_CORPUS)
    for row in questions:
        word = re.compile(rf"\b{re.escape(row['answer'])}\b", re.IGNORECASE)
        holders = [p["id"] for p in passages if word.search(p["title"] + " " + p["text"])]
        assert len(holders) == 1, row
        assert index.search(row["question"], 1)[0][0].id == holders[0], row
        assert not word.search(row["question"]), row  # the question does not give the answer away


def test_no_temp_dirs_left_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this test's own: other tests may run the tool at the same time
    tempfile.tempdir = None  # read TMPDIR again
    try:
        tool("python", timeout_s=0.5).call({"code": "while True: pass"})
        assert not [p for p in os.listdir(tmp_path) if p.startswith("rlinf-python-")]
    finally:
        tempfile.tempdir = None
