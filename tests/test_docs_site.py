"""The docs site: MkDocs (Material) builds it offline with warnings as errors (a broken link, a page left out of
the navigation, a missing anchor fails), and its config reference is the schema's, key for key."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_like.config import reference
from rlinf_like.config.schema import describe
from rlinf_like.config.show import SCHEMAS, schema

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_offline_with_warnings_as_errors(tmp_path):
    pytest.importorskip("material", reason="the docs extra (mkdocs-material) is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY":
           "http://127.0.0.1:9"}  # offline: anything the build fetched would fail
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert not re.search(r"^(WARNING|ERROR)", done.stderr, re.M), done.stderr[-5000:]
    for page in ("index.html", "architecture/index.html", "reference/config/index.html",
                 "reference/config/reasoning/rollout/index.html", "benchmarks/index.html"):
        assert (site / page).is_file(), page
    # every docs page is in the site (a page the navigation leaves out is a warning, so this is the build's too)
    pages = [p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md")]
    built = [site / ("index.html" if p.stem in ("index", "README") and p.parent == Path(".") else
                     p.with_suffix("") / "index.html" if p.stem != "index" else p.with_suffix(".html")) for p in pages]
    assert [p for p, b in zip(pages, built) if not b.is_file()] == []


def test_the_config_reference_is_the_schema():
    assert reference.stale() == [], "run `python -m rlinf_like.config.reference` and commit docs/reference/config/"
    pages = reference.pages()
    for name in SCHEMAS:
        text = "".join(v for k, v in pages.items() if k.startswith(f"{name}/"))
        keys = [key for key, spec, _ in describe(schema(name)) if spec]
        rows = re.findall(r"^\| `([\w.]+)` \|", text, re.M)
        assert sorted(rows) == sorted(keys) and len(set(rows)) == len(rows)  # every key, once
    rollout = pages["reasoning/rollout.md"]
    assert re.search(r"^\| `rollout\.engine` \| `'\w+'` \|", rollout, re.M)


def test_a_changed_schema_comment_makes_the_reference_stale(tmp_path, monkeypatch):
    monkeypatch.setattr(reference, "_presets", lambda name, cls: [])  # the sections' pages are what is checked here
    reference.write(tmp_path)
    assert reference.stale(tmp_path) == []
    real = reference.field_comments
    monkeypatch.setattr(reference, "field_comments",
                        lambda cls: {k: v + " (changed)" for k, v in real(cls).items()})
    assert "reasoning/runner.md" in reference.stale(tmp_path)
    (tmp_path / "reasoning" / "extra.md").write_text("left over")
    monkeypatch.setattr(reference, "field_comments", real)
    assert reference.stale(tmp_path) == ["reasoning/extra.md"]


def test_the_benchmark_plots_are_drawn_from_the_pages_tables(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("plot_pages", ROOT / "bench" / "plot_pages.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    header, *rows = plots.table(ROOT / "docs/benchmarks/rollout.md", "batch | native | transformers")
    assert header[0] == "batch" and [r[0] for r in rows] == ["1", "32", "128", "256"]
    plots.main(["--out", str(tmp_path)])
    for name in ("main_job_accuracy.png", "decode_step_by_batch.png"):
        drawn = (tmp_path / name).read_bytes()
        assert drawn[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"img/{name}" in "".join(p.read_text() for p in (ROOT / "docs/benchmarks").glob("*.md"))
        assert (ROOT / "docs/benchmarks/img" / name).read_bytes() == drawn  # the committed plot is the table's
