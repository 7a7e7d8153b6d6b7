"""The `extended` tier (`pytest --extended`; tests/conftest.py): README's test command leaves these out to hold its
15-minute budget on 2 cores. Each is an end-to-end variant whose parts the default suite tests, and none is one of the
exactness guarantees (golden runs, exact resume, the SIGKILL fault test, reshard bit-exactness, in-process == Ray,
real-model tests): what moves into the tier is named here, so it cannot grow unseen."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
EXTENDED = {
    "test_multinode.py::test_two_slurm_nodes_on_loopback_run_a_pipelined_ppo_job_across_both",
    "test_verifiers.py::test_a_two_step_grpo_run_on_the_example_environment_resumes_mid_run",
    "test_openenv.py::test_grpo_on_the_openenv_example_runs_two_steps",
    "test_bench_lora.py::test_quick_run_ends_with_the_json_line",
    "test_actor_megatron.py::test_megatron_tp2_actor_steps_like_fsdp_and_syncs_its_exported_weights",
    # SAC's learning curve on Pendulum (the SAC runner's test in the suite learns, syncs and resumes exactly), the
    # verifiers demonstrations (the exact-token and rubric test stays), and fp16 overflow skipping on two FSDP ranks
    # (the scaler's own test stays; fp16 is a GPU precision, and test_fsdp_fp16_trains_on_gpu runs there)
    "test_sac.py::test_sac_learns_pendulum",
    "test_verifiers.py::test_demonstrations_play_through_the_environment",
    "test_grad_scaler.py::test_fsdp_fp16_manager_skips_overflow_on_every_rank",
    # ray_launch.sh's head started, reported, joined and stopped (the two-node run above starts, joins and stops
    # through it too); its usage errors stay in the suite
    "test_ray_launch.py::test_start_status_join_stop",
    # a seeded chaos run against a fault-free one (~2.5 min); the fault test's one restart stays in the suite
    "test_chaos.py::test_a_seeded_chaos_run_ends_with_the_weights_of_a_fault_free_run",
    "test_chaos.py::test_embodied_ppo_survives_a_killed_env_worker_with_a_fault_free_runs_weights",
    "test_chaos.py::test_an_async_run_survives_kills_and_trains_each_group_once",
}
# the files that hold the guarantees: none of their tests may be extended
GUARANTEES = ("test_golden_runs.py", "test_faults.py", "test_local_backend.py", "test_dynamic_schedule.py",
              "test_weight_sync.py", "test_real_model.py", "test_reasoning_runner.py", "test_megatron_manager.py")


def marked(mark: str) -> set[str]:
    """`file::test` of every test function carrying @pytest.mark.<mark>."""
    found = set()
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    ast.unparse(d).split("(")[0] == f"pytest.mark.{mark}" for d in node.decorator_list):
                found.add(f"{path.name}::{node.name}")
    return found


def test_the_extended_tier_is_the_listed_tests_and_no_guarantee():
    assert marked("extended") == EXTENDED
    assert not [t for t in EXTENDED if t.split("::")[0] in GUARANTEES]


def test_the_heavy_files_named_for_the_schedule_exist_and_come_first():
    from conftest import HEAVY_FIRST, heaviest_first

    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST) and all((TESTS / name).is_file() for name in HEAVY_FIRST)

    class Item:
        def __init__(self, name, i):
            self.path, self.i = TESTS / name, i

    items = [Item("test_zzz_unlisted.py", 0), Item(HEAVY_FIRST[1], 1), Item("test_aaa_unlisted.py", 2),
             Item(HEAVY_FIRST[0], 3), Item(HEAVY_FIRST[1], 4)]
    heaviest_first(items)
    assert [it.i for it in items] == [3, 1, 4, 0, 2]  # listed by rank, a file's tests in order, the rest after
