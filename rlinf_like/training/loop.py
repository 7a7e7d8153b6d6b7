"""The one training loop every trained role runs (actor, critic): epochs x mini-batches, one
optimizer step per mini-batch, micro-batches accumulating gradients inside it with only the last
one syncing them. The manager owns parallelism; the loss function owns the algorithm.

Micro-batches are either `micro_batch_size` rows of this rank's shard (each scaled 1 / count), or,
with `max_tokens_per_micro_batch`, cut by token count and balanced over the ranks
(`micro_batching.py`); each is then scaled by its share of the mini-batch's loss tokens (times the
data-parallel size, which the gradient average divides out), so the accumulated gradient equals
that of the whole mini-batch in one pass. `pack_sequences` runs every micro-batch packed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch

from rlinf_like.config.validate import bounded
from rlinf_like.data.batch import Batch, read_mask, select_rows, shard_rows
from rlinf_like.hybrid_engines.model_manager import LossFn, ModelManager
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.hybrid_engines.prompt_sharing import group_ids, group_members, share_batch, unsupported
from rlinf_like.training.micro_batching import sequence_lengths, token_budget_plan, trim_padding


AUTO_ROWS_CAP = 64  # a CPU GEMM is as fast per row well before this many rows of a real prompt and answer


@dataclass(kw_only=True)
class LoopConfig:
    """`actor.loop` as the user writes it (the critic trains with the same loop)."""
    epochs: int = bounded(1, gt=0)  # passes over each step's batch
    mini_batches: int = bounded(1, gt=0)  # optimizer steps per epoch
    # rows per forward/backward (per rank); null: as many as the memory budget holds (a run's: actor.memory_gb), at
    # most 64 (AUTO_ROWS_CAP); with no budget (a loop built directly), a mini-batch in one pass
    micro_batch_size: int | None = bounded(None, gt=0)
    pack_sequences: bool = False  # micro-batches run packed (no compute on padding)
    max_batch_seqlen: int | None = bounded(None, gt=0)  # packed row length; null: each micro-batch's longest sequence
    # token-budget micro-batches (per rank), balanced over the ranks, instead of micro_batch_size
    max_tokens_per_micro_batch: int | None = bounded(None, gt=0)
    # the rows of a micro-batch that share a prompt run it once, as [prompt, r1, ..., rn] with a mask that keeps each
    # response to the prompt and its own past (hybrid_engines/prompt_sharing.py); micro-batches then hold whole groups
    # (by rows, sharing only within each, where a group's laid-out positions exceed the memory budget).
    # auto: on for an FSDP actor on an HF causal LM when a prompt has several samples; the critic does not share yet
    share_prompt: Literal["auto", "true", "false"] = "auto"


@dataclass(frozen=True, kw_only=True)
class LoopTerms:
    """What the run decides about the loop beyond `actor.loop`."""
    seed: int = 0  # seeds the shuffle (runner.seed)
    # rows per micro-batch = this token budget // the batch's padded length, at most AUTO_ROWS_CAP, when
    # micro_batch_size is null (the runner derives it from the model and the actor's memory:
    # runners/reasoning/memory.py); None: a mini-batch in one pass
    micro_batch_tokens: int | None = None
    # with shared prompts: the model's attention FLOPs per query-key pair over its other FLOPs per token
    # (prompt_sharing.pair_cost); a micro-batch is laid out shared only where that is the cheaper forward (0: always)
    share_pair_cost: float = 0.0


def check_loop(loop: LoopConfig, owner: str = "loop") -> None:
    """Errors name the key (`owner.field`) and what is allowed."""
    for key in ("micro_batch_size", "max_batch_seqlen", "max_tokens_per_micro_batch"):
        value = getattr(loop, key)
        if value is not None and value < 1:
            raise ValueError(f"{owner}.{key} must be >= 1 or null, got {value}")
    if loop.max_batch_seqlen is not None and not loop.pack_sequences:
        raise ValueError(f"{owner}.max_batch_seqlen={loop.max_batch_seqlen} needs {owner}.pack_sequences=true")
    if loop.share_prompt == "true" and (loop.pack_sequences or loop.max_tokens_per_micro_batch is not None):
        other = "pack_sequences=true" if loop.pack_sequences else \
            f"max_tokens_per_micro_batch={loop.max_tokens_per_micro_batch}"
        raise ValueError(f"{owner}.share_prompt=true does not combine with {owner}.{other} (micro-batches of shared "
                         f"prompts are whole groups, unpacked): set one of them off, or share_prompt=auto")
    if (loop.pack_sequences and loop.max_tokens_per_micro_batch is not None and loop.max_batch_seqlen is not None
            and loop.max_batch_seqlen > loop.max_tokens_per_micro_batch):
        raise ValueError(f"{owner}.max_batch_seqlen={loop.max_batch_seqlen} exceeds "
                         f"{owner}.max_tokens_per_micro_batch={loop.max_tokens_per_micro_batch}")


def num_rows(batch: Batch) -> int:
    return next(iter(batch.values())).shape[0]


def loss_tokens(batch: Batch) -> float:
    """The tokens a token-mean loss averages over: response_mask, else loss_mask / attention_mask
    shifted to the predicted tokens, else every predicted token."""
    mask = read_mask(batch)
    return float(mask.sum()) if mask is not None else float(batch["input_ids"][:, 1:].numel())


def micro_batches(batch: Batch, size: int | None) -> list[Batch]:
    n = num_rows(batch)
    size = size or max(n, 1)
    return [select_rows(batch, slice(i, i + size)) for i in range(0, n, size)]




def micro_rows(batch: Batch, loop: LoopConfig, tokens: int | None = None) -> int | None:
    """Rows per micro-batch of `batch` (None: all in one pass), `tokens` the memory budget
    (`LoopTerms.micro_batch_tokens`); the same on every rank, since every rank holds rows padded to the whole
    batch's length."""
    if loop.micro_batch_size is not None or tokens is None:
        return loop.micro_batch_size
    length = batch["input_ids"].shape[1] if "input_ids" in batch else 1
    return max(1, min(AUTO_ROWS_CAP, tokens // length))


def resolve_share_prompt(loop: LoopConfig, model: torch.nn.Module, owner: str = "actor.loop") -> LoopConfig:
    """`loop` with `share_prompt` decided for `model`: auto turns it on where the model supports it and the
    micro-batches are plain rows; true where the model does not is refused, naming why."""
    if loop.share_prompt == "false":
        return loop
    why = unsupported(model)
    if why is None and not loop.pack_sequences and loop.max_tokens_per_micro_batch is None:
        return replace(loop, share_prompt="true")
    if loop.share_prompt == "true":
        raise ValueError(f"{owner}.share_prompt=true: {why}; set it to auto or false")
    return replace(loop, share_prompt="false")


def sharing(loop: LoopConfig, batch: Batch) -> bool:
    """Whether `batch`'s micro-batches run with shared prompts: `share_prompt` resolved to true (a worker resolves
    auto by what its model supports) and rows that say where their prompt ends (RL batches; not SFT ones), without
    mixture-of-experts routes (`routing_replay` forces them row by row, and a shared prompt is laid out once)."""
    return loop.share_prompt == "true" and "prompt_lengths" in batch and "routes" not in batch


def _prepare(micro: Batch, loop: LoopConfig, terms: LoopTerms = LoopTerms()) -> Batch:
    if sharing(loop, micro):
        return share_batch(micro, terms.share_pair_cost)
    return pack_batch(micro, loop.max_batch_seqlen) if loop.pack_sequences else micro


def _group_micros(members: list[list[int]], spans: list[int], order: torch.Tensor, loop: LoopConfig,
                  rows: int | None, tokens: int | None) -> list[list[list[int]]]:
    """Per mini-batch: micro-batches as lists of groups (indices into `members`, each group's rows), in the shuffled
    group `order`, each filled up to `rows` rows (actor.loop.micro_batch_size) or, without it, up to `tokens` laid-out
    positions (the memory budget: a micro-batch of shared groups holds n groups of the longest one's `spans`) and
    AUTO_ROWS_CAP rows, and at least one group."""
    steps = []
    for mini in order.tensor_split(loop.mini_batches):
        micros: list[list[int]] = []
        for g in mini.tolist():
            if micros:
                held = micros[-1]
                if rows is not None:
                    fits = sum(len(members[h]) for h in held) + len(members[g]) <= rows
                elif tokens is not None:  # and at most AUTO_ROWS_CAP rows, as micro_rows caps a rows plan
                    fits = ((len(held) + 1) * max(spans[g], *(spans[h] for h in held)) <= tokens
                            and sum(len(members[h]) for h in held) + len(members[g]) <= AUTO_ROWS_CAP)
                else:  # no size given: the mini-batch in one pass
                    fits = True
                if fits:
                    held.append(g)
                    continue
            micros.append([g])
        steps.append(micros)
    return steps


def _split_to(micros: list[list[int]], count: int) -> list[list[int]] | None:
    """`micros` cut into `count` micro-batches by halving the one of most groups (each then needs less memory);
    None where no micro-batch has two groups left to split."""
    micros = [list(m) for m in micros]
    while len(micros) < count:
        widest = max(range(len(micros)), key=lambda i: len(micros[i]), default=None)
        if widest is None or len(micros[widest]) < 2:
            return None
        held = micros.pop(widest)
        micros[widest:widest] = [held[: len(held) // 2], held[len(held) // 2:]]
    return micros


def _by_groups(batch: Batch, rank: int, world_size: int, loop: LoopConfig, terms: LoopTerms,
               generator) -> list[list[tuple[Batch, float]]] | None:
    """`_by_rows` with groups (rows sharing a prompt) as the unit of the shuffle and of micro-batches, so that a
    micro-batch holds whole groups, sized by the laid-out positions it holds when the memory budget sizes it. Every
    rank must run as many micro-batches as the others (FSDP's collectives): a rank with fewer splits its fullest
    ones; None where it cannot (the caller then plans by rows)."""
    state = generator.get_state()
    plans = []
    for r in range(world_size):  # every rank holds the whole batch, so each plans every rank's micro-batches
        generator.set_state(state)
        mine = shard_rows(batch, r, world_size)
        groups = group_ids(mine)
        members = group_members(groups)
        lengths = (mine["attention_mask"].sum(1) if "attention_mask" in mine
                   else torch.full((len(groups),), mine["input_ids"].shape[1])).tolist()
        prompts = mine["prompt_lengths"].tolist()
        spans = [prompts[m[0]] + sum(lengths[b] - prompts[b] for b in m) for m in members]
        tokens = terms.micro_batch_tokens if loop.micro_batch_size is None else None
        if tokens is not None and max(spans, default=0) > tokens:
            # a micro-batch holds at least one group: a group longer than the memory budget would overrun it (a
            # GRPO group of 8 IFEval answers of ~190 tokens is ~1,700 positions against SmolLM2's 879 a rank, and
            # its ranks peaked at 5.4 GiB against 3.5); by rows, each micro-batch keeps to the budget
            generator.set_state(state)
            return None
        order = torch.randperm(len(members), generator=generator)
        rows = None if tokens is not None else micro_rows(mine, loop, None)
        plans.append((mine, members, _group_micros(members, spans, order, loop, rows, tokens)))
    for m in range(loop.mini_batches):
        count = max(len(steps[m]) for _, _, steps in plans)
        for _, _, steps in plans:
            steps[m] = _split_to(steps[m], count)
            if not steps[m]:
                generator.set_state(state)
                return None
    mine, members, steps = plans[rank]
    return [[(_prepare(select_rows(mine, torch.tensor([b for g in micro for b in members[g]])), loop, terms),
              1 / len(micros)) for micro in micros] for micros in steps]


def _by_rows(batch: Batch, rank: int, world_size: int, loop: LoopConfig, terms: LoopTerms,
             generator) -> list[list[tuple[Batch, float]]]:
    """Per optimizer step: this rank's (micro-batch, loss scale) pairs, `micro_rows` rows each."""
    tokens = terms.micro_batch_tokens
    if sharing(loop, batch):
        steps = _by_groups(batch, rank, world_size, loop, terms, generator)
        if steps is not None:
            return steps
    mine = shard_rows(batch, rank, world_size)
    order = torch.randperm(num_rows(mine), generator=generator)
    steps = []
    for mini in order.tensor_split(loop.mini_batches):  # always that many pieces (chunk may give fewer)
        micros = micro_batches(select_rows(mine, mini), micro_rows(mine, loop, tokens))
        steps.append([(_prepare(m, loop, terms), 1 / len(micros)) for m in micros])
    return steps


def token_budget_steps(batch: Batch, rank: int, world_size: int, loop: LoopConfig, generator,
               weigh: Callable[[Batch], float]) -> list[list[tuple[Batch, float]]]:
    """Per optimizer step: this rank's token-budget micro-batches, each scaled by its loss share."""
    order = torch.randperm(num_rows(batch), generator=generator)  # the same on every rank
    steps = []
    for mini_rows in order.tensor_split(loop.mini_batches):
        mini = select_rows(batch, mini_rows)
        plan = token_budget_plan(sequence_lengths(mini).tolist(), world_size, loop.max_tokens_per_micro_batch,
                                 packed=loop.pack_sequences)[rank]
        total = weigh(mini) or 1.0
        micros = [trim_padding(select_rows(mini, torch.tensor(rows))) for rows in plan]
        steps.append([(_prepare(m, loop), world_size * weigh(m) / total) for m in micros])
    return steps


def plan_steps(batch: Batch, rank: int, world_size: int, loop: LoopConfig, step: int, epochs: int | None = None,
               weigh: Callable[[Batch], float] = loss_tokens,
               terms: LoopTerms = LoopTerms()) -> Iterator[list[tuple[Batch, float]]]:
    """Per optimizer step, lazily: this rank's (micro-batch, loss scale) pairs for `epochs` passes over
    `batch`. The shuffle depends on the seed and the optimizer step `step` only, so a resumed run replays the
    same order."""
    generator = torch.Generator().manual_seed(terms.seed * 1000 + step)
    for _ in range(loop.epochs if epochs is None else epochs):
        if loop.max_tokens_per_micro_batch is None:
            yield from _by_rows(batch, rank, world_size, loop, terms, generator)
        else:
            yield from token_budget_steps(batch, rank, world_size, loop, generator, weigh)


def run_steps(manager: ModelManager, steps: Iterable[list[tuple[Batch, float]]], loss_fn: LossFn) -> dict[str, float]:
    """The loop: per optimizer step, accumulate its micro-batches (only the last syncs gradients), then
    step. Returns metrics averaged over steps. `steps` comes from `plan_steps` or a `BatchResizer`."""
    totals: dict[str, float] = {}
    count = 0
    for micros in steps:
        with manager.accumulating():
            for i, (micro, scale) in enumerate(micros):
                metrics = manager.forward_backward(micro, loss_fn, loss_scale=scale,
                                                   sync_gradients=i == len(micros) - 1)
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v / len(micros)
        for k, v in manager.optim_step().items():
            totals[k] = totals.get(k, 0.0) + v
        count += 1
    return {k: v / count for k, v in totals.items()}


def train_epochs(manager: ModelManager, batch: Batch, loss_fn: LossFn, rank: int, world_size: int,
                 loop: LoopConfig, epochs: int | None = None,
                 weigh: Callable[[Batch], float] = loss_tokens, terms: LoopTerms = LoopTerms()) -> dict[str, float]:
    """Train this data-parallel rank on its rows of `batch`; returns metrics averaged over steps.
    Every rank must run the same number of micro-batches (each is a collective under FSDP): by rows
    the runner checks that the rows divide by world_size x mini_batches before launching; by tokens
    the plan gives every rank the same count. `weigh` is what the loss averages over (loss tokens
    for token-mean losses, `num_rows` for sequence means); it sets the token-budget scales."""
    return run_steps(manager, plan_steps(batch, rank, world_size, loop, manager.step, epochs, weigh, terms), loss_fn)
