"""Multi-turn rollout throughput with tools that take a fixed time: the agent loop (every episode on its own,
turns of different episodes overlapping in the engine's continuous batch) against the same engine driven turn by
turn in lock-step (turn t of every episode as one `engine.generate` batch, then every tool at once in a thread
pool, then turn t+1).

    python bench/agentic.py                          # 64 episodes x 3 turns, 50 ms tools, 3 repetitions a side
    python bench/agentic.py --episodes 16 --turns 6  # fewer episodes, more turns each
    python bench/agentic.py --critical-path          # also each request alone: the agent loop's floor, the bound
    python bench/agentic.py --no-prefix-cache        # rollout.prefix_cache=false: every turn prefilled whole
    python bench/agentic.py --quick                  # 8 episodes, one repetition a side: checks the script runs

Both sides run the same episodes (`workers/rollout/agentic/episode.py`: the same prompts, per-turn seeds, limits and
token bookkeeping) on one native engine, so they sample the same tokens: the throughput is model tokens per
second of wall time. Model: the tiny char-level model (`--model`, default) made to end its turns
(`end_turns_like`), with examples/agentic/chat_template.jinja; or a checkpoint folder with its own template. The
sides alternate (lock-step first in even repetitions), each with a cold prefix cache (`engine.reset_prefix_cache()`).
Last line: {"bench": "agentic", "throughput_ratio": median ours / median lock-step tokens per second,
"lockstep_engine_idle_share": the share of the lock-step wall time the engine sat idle while tools ran (hiding all
of it gives at most 1 / (1 - share)), "lockstep_turn_tokens": the sum over turns of the longest turn (lock-step
decodes turn by turn), "longest_episode_tokens": the agent loop's longest episode (it cannot finish sooner), and
with `--critical-path` "critical_path_s": the slowest request's episodes served alone (the agent loop's floor on
this machine) and "critical_path_ratio_bound": median lock-step wall / that, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_like.envs.text import TextEnv, TextStep  # noqa: E402
from rlinf_like.models import load_tokenizer  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, end_turns_like, write_tiny_model  # noqa: E402
from rlinf_like.utils.threads import limit_threads  # noqa: E402
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine  # noqa: E402
from rlinf_like.workers.rollout.agentic.agent_loop import AgentLimits, AgentLoop  # noqa: E402
from rlinf_like.workers.rollout.engines.engine_client import EngineClient  # noqa: E402

CALC = {"type": "function", "function": {"name": "calc", "parameters": {"properties": {"expr": {}}}}}


class SleepyTool(TextEnv):
    """Every turn is a tool call that takes `latency_s` and answers; the episode ends after `turns` turns."""

    tools = (CALC,)

    def __init__(self, latency_s: float, turns: int):
        self.latency_s, self.turns, self.calls = latency_s, turns, 0

    def reset(self, row):
        return [{"role": "system", "content": "Use calc."}, {"role": "user", "content": row["q"]}]

    def step(self, assistant_message):
        time.sleep(self.latency_s)
        self.calls += 1
        if self.calls >= self.turns:
            return TextStep(None, reward=1.0, done=True)
        return TextStep([{"role": "tool", "content": f"={self.calls * 7}"}], info={"tool_calls": 1})


def workload(args) -> tuple[list[RolloutRequest], list[dict]]:
    requests = [RolloutRequest(f"q{i}", [], SamplingParams(temperature=1.0, seed=i), n=args.n)
                for i in range(args.episodes // args.n)]
    return requests, [{"q": f"What is {i}*{i + 3}?"} for i in range(len(requests))]


def model_tokens(results) -> int:
    return sum(sum(mask) for r in results for mask in r.response_masks)


def turn_lengths(results) -> list[list[int]]:
    """Each sample's model tokens per turn (its runs of mask 1; the tool answers lie between them)."""
    out = []
    for r in results:
        for mask in r.response_masks:
            runs = "".join(map(str, mask)).split("0")
            out.append([len(run) for run in runs if run])
    return out


def length_bound(lengths: list[list[int]]) -> tuple[int, int]:
    """(sum over turns of the longest turn: the tokens lock-step turns take one after another, the longest
    episode's tokens: what the agent loop cannot go below): their ratio bounds the throughput ratio when
    decode steps are all the time there is."""
    turns = max(map(len, lengths))
    return (sum(max(e[t] for e in lengths if len(e) > t) for t in range(turns)), max(map(sum, lengths)))


def ours(engine, loop_args, args, only: slice = slice(None)) -> tuple[float, int, dict]:
    requests, rows = workload(args)
    requests, rows = requests[only], rows[only]
    began = time.perf_counter()
    with EngineClient(engine) as client:
        results = AgentLoop(client, *loop_args).run(requests, rows)
    wall = time.perf_counter() - began
    reasons = sorted({e.end_reason for r in results for e in r.episodes})
    return wall, model_tokens(results), {"end reasons": reasons, "lengths": turn_lengths(results)}


def critical_path(engine, loop_args, args) -> float:
    """The agent loop's floor on this machine: the slowest request's episodes served alone (tools included)."""
    walls = []
    for i in range(args.episodes // args.n):
        engine.reset_prefix_cache()
        walls.append(ours(engine, loop_args, args, slice(i, i + 1))[0])
    return max(walls)


def lockstep(engine, loop_args, args) -> tuple[float, int, dict]:
    """Turn t of every live episode as one generate batch, then all their tools at once."""
    from rlinf_like.workers.rollout.agentic.episode import group_result

    requests, rows = workload(args)
    began = time.perf_counter()
    with EngineClient(engine) as client:  # only to build the episodes (max_context); it serves nothing here
        loop = AgentLoop(client, *loop_args)
        groups = [[loop.episode(request, sample) for sample in range(request.n)] for request in requests]
    jobs = [(episode, row) for group, row in zip(groups, rows) for episode in group]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        list(pool.map(lambda job: job[0].start(job[0].env.reset(job[1])), jobs))
        live = [episode for episode, _ in jobs]
        generating = 0.0
        while live:
            turn = [(episode, request) for episode in live if (request := episode.next_request()) is not None]
            t0 = time.perf_counter()
            results = engine.generate([request for _, request in turn])
            generating += time.perf_counter() - t0
            stepping = [(episode, text) for (episode, _), result in zip(turn, results)
                        if (text := episode.record_turn(result)) is not None]

            def tool(item):
                episode, text = item
                t0 = time.perf_counter()
                return episode.env.step(text), time.perf_counter() - t0

            for (episode, _), (step, wait) in zip(stepping, pool.map(tool, stepping)):
                episode.record_env(step, wait)
            live = [episode for episode, _ in stepping if not episode.done]
    wall = time.perf_counter() - began
    tokens = model_tokens([group_result(q, g, engine.version) for q, g in zip(requests, groups)])
    return wall, tokens, {"idle_share": round(1 - generating / wall, 3)}  # the engine's, while tools ran


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--n", type=int, default=4, help="samples per request")
    p.add_argument("--turns", type=int, default=3, help="model turns per episode (a tool call after each but the last)")
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--max-new-tokens", type=int, default=64, help="per turn")
    p.add_argument("--slots", type=int, default=64, help="rollout.max_batch_size")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--model", default="", help="a checkpoint folder (its own chat template); default: tiny")
    p.add_argument("--no-prefix-cache", action="store_true", help="rollout.prefix_cache=false")
    p.add_argument("--critical-path", action="store_true", help="also time each request's episodes served alone")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.n, args.reps = 8, 2, 1
    limit_threads()
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            path, template = args.model, None
        else:
            path = str(end_turns_like(write_tiny_model(tmp, TinyModelSpec(max_position_embeddings=1024))))
            template = str(ROOT / "examples" / "agentic" / "chat_template.jinja")
        engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=args.slots,
                                           kv_cache_memory_gb=0.5, prefix_cache=not args.no_prefix_cache))
        limits = AgentLimits(max_turns=args.turns, max_total_tokens=args.turns * (args.max_new_tokens + 32),
                             max_new_tokens_per_turn=args.max_new_tokens)
        loop_args = (load_tokenizer(path), template, lambda: SleepyTool(args.latency_ms / 1000, args.turns), limits)
        print(f"settings: {vars(args)}; model {path if args.model else 'tiny (ends turns like z)'}")
        print(f"machine: {os.cpu_count()} cores, load average at start {load_start}")
        lengths = ours(engine, loop_args, args)[2].pop("lengths")  # warm-up: allocate the cache, fill the caches
        lockstep_tokens, longest = length_bound(lengths)
        times: dict[str, list[float]] = {"ours": [], "lockstep": []}
        walls: dict[str, list[float]] = {"ours": [], "lockstep": []}
        idle: list[float] = []
        for rep in range(args.reps):
            order = [("lockstep", lockstep), ("ours", ours)]
            for name, side in order if rep % 2 == 0 else order[::-1]:
                engine.reset_prefix_cache()  # cold: the same episodes ran before, and would find all their turns
                counted = engine.prefilled_tokens, engine.prefix_hit_tokens
                wall, tokens, notes = side(engine, loop_args, args)
                notes["prefilled"] = engine.prefilled_tokens - counted[0]
                notes["prefix_hits"] = engine.prefix_hit_tokens - counted[1]
                notes.pop("lengths", None)
                times[name].append(tokens / wall)
                idle.extend([notes["idle_share"]] if "idle_share" in notes else [])
                print(f"rep {rep} {name:8s}: {wall:.3f} s, {tokens} model tokens, {tokens / wall:.0f} tokens/s {notes}")
                walls[name].append(wall)
        floor = critical_path(engine, loop_args, args) if args.critical_path else None
    print(f"machine: load average at end {os.getloadavg()}")
    ours_tps, lock_tps = statistics.median(times["ours"]), statistics.median(times["lockstep"])
    # hiding every second the lock-step engine sits idle would give at most 1 / (1 - idle share); the agent loop
    # takes at least its longest episode's turns: lockstep_turn_tokens / longest_episode_tokens bounds the ratio
    # if decode steps are all the time there is and cost the same; median lock-step wall / critical_path_s does on
    # this machine
    if floor is not None:
        print(f"critical path (the slowest request's episodes alone): {floor:.3f} s; lock-step median "
              f"{statistics.median(walls['lockstep']):.3f} s")
    print(json.dumps({"bench": "agentic", "throughput_ratio": round(ours_tps / lock_tps, 3),
                      "lockstep_engine_idle_share": statistics.median(idle),
                      "ours_tokens_per_s": round(ours_tps, 1), "lockstep_tokens_per_s": round(lock_tps, 1),
                      "episodes": args.episodes, "turns": args.turns, "latency_ms": args.latency_ms,
                      "prefix_cache": not args.no_prefix_cache, "lockstep_turn_tokens": lockstep_tokens,
                      "longest_episode_tokens": longest,
                      "critical_path_s": None if floor is None else round(floor, 3),
                      "critical_path_ratio_bound": None if floor is None
                      else round(statistics.median(walls["lockstep"]) / floor, 3)}))


if __name__ == "__main__":
    main()
