"""No import cycles among rlinf_like's modules: shared types live in leaf modules (rollout/base.py,
models/policy_base.py, runtime/worker_host.py, ...) so that modules import them, not each other."""

from pathlib import Path

from import_graph import find_cycles, import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_no_cycle_among_module_level_imports():
    assert find_cycles(import_graph(ROOT, "rlinf_like")) == []


def test_no_cycle_hidden_by_deferring_an_import():
    """Deferring an import into a function hides a cycle from the import machinery, not from readers:
    engines <-> their factory, policies <-> vla, Worker <-> WorkerGroup, Megatron checkpoint <-> manager
    were such cycles."""
    assert find_cycles(import_graph(ROOT, "rlinf_like", deferred=True)) == []


def test_the_checker_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import a\n")
    (pkg / "sub" / "a.py").write_text("from .b import thing\n")
    (pkg / "sub" / "b.py").write_text("import pkg.sub.c\nthing = 1\n")
    (pkg / "sub" / "c.py").write_text("class C:\n    from pkg.sub import a\n")  # class bodies run on import
    (pkg / "d.py").write_text("def f():\n    from pkg import e\n")  # deferred
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    (pkg / "f.py").write_text("from pkg import e\n")
    assert find_cycles(import_graph(tmp_path, "pkg")) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]
    assert find_cycles(import_graph(tmp_path, "pkg", deferred=True)) == [["pkg.d", "pkg.e"],
                                                                         ["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]
