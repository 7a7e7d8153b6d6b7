"""The reasoning runner's checks: every one runs in the driver before any worker starts and names the
key. Choices are read from the registries and capabilities from what each component declares."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from rlinf_like.algorithms import ADVANTAGE_ESTIMATORS
from rlinf_like.algorithms.advantage_estimators import build_estimator
from rlinf_like.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS
from rlinf_like.algorithms.offpolicy import IS_CORRECTIONS, POLICY_LOSSES
from rlinf_like.runners.reasoning.actor_setup import check_actor_section
from rlinf_like.runners.reasoning.agent_checks import check_agent
from rlinf_like.runners.reasoning.async_stream import STALE_POLICIES
from rlinf_like.runners.reasoning.config import AlgorithmConfig, CriticSection, ReasoningConfig
from rlinf_like.workers.reward.fn import AUTO, REWARD_FNS, needs_judge
from rlinf_like.workers.reward.judge import JudgeConfig
from rlinf_like.workers.actor.loss import LossConfig
from rlinf_like.config import check_instance
from rlinf_like.data.sources import check_data_config
from rlinf_like.models import load_tokenizer, read_hf_config
from rlinf_like.models.tiny import char_tokenizer
from rlinf_like.models.families import MODEL_FAMILIES, ModelConfig
from rlinf_like.models.families.config import check_checkpoint, checkpoint_names
from rlinf_like.runners.reasoning.worker_configs import reward_config
from rlinf_like.runners.reasoning.schedules import SCHEDULES, STATIC, schedule_choices
from rlinf_like.runtime.placement import share_devices
from rlinf_like.training.loop import check_loop
from rlinf_like.workers.actor.backends import BACKEND_REGISTRY
from rlinf_like.workers.reward.combine import check_reward_config
from rlinf_like.workers.rollout.engine import check_returns_routes, check_rollout_config, engine_class

def estimators_where(**declared: bool) -> list[str]:
    """The registered estimators whose declarations match, e.g. estimators_where(needs_critic=True)."""
    return [name for name in ADVANTAGE_ESTIMATORS.names()
            if all(getattr(ADVANTAGE_ESTIMATORS.get(name), k) == v for k, v in declared.items())]



def check_choices(cfg: ReasoningConfig) -> None:
    """The keys whose choices are registries (fixed choices are `Literal`s, checked with the schema)."""
    choices = {"algorithm.advantage": (cfg.algorithm.advantage, ADVANTAGE_ESTIMATORS.names()),
               "actor.loss.aggregation": (cfg.actor.loss.aggregation, AGGREGATIONS.names()),
               "actor.loss.kl_estimator": (cfg.actor.loss.kl_estimator, KL_ESTIMATORS.names()),
               "actor.loss.objective": (cfg.actor.loss.objective, POLICY_LOSSES.names()),
               "actor.loss.is_correction": (cfg.actor.loss.is_correction, IS_CORRECTIONS.names()),
               "runner.schedule": (cfg.runner.schedule, schedule_choices()),
               "runner.stale_policy": (cfg.runner.stale_policy, list(STALE_POLICIES)),
               "actor.backend": (cfg.actor.backend, BACKEND_REGISTRY.names())}
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"{key}={value!r} is not one of {allowed}")
    # the engine by name, its logprobs and TP by what it declares
    check_rollout_config(cfg.rollout, cfg.rollout.tp_size)


def check_routing_replay(cfg: ReasoningConfig, hf: dict | None) -> None:
    """actor.routing_replay (R2, R3) and rollout.return_routes need a mixture-of-experts model (`hf`: its
    config.json; None for the tiny dense model), trained by the fsdp actor on batches laid out row by row or
    packed. R3 and return_routes need an engine that returns routes; R2 the recomputation it records them in."""
    mode = cfg.actor.routing_replay
    key = (f"actor.routing_replay={mode}" if mode != "disabled"
           else "rollout.return_routes" if cfg.rollout.return_routes else None)
    if key is None:
        return
    family = MODEL_FAMILIES.for_model_type((hf or {}).get("model_type"))
    if family is None or family.moe is None:
        moe = [f for f in MODEL_FAMILIES.names() if MODEL_FAMILIES.get(f).moe]
        raise ValueError(f"{key} needs a mixture-of-experts model (families {moe}); model.path="
                         f"{cfg.model.path or '(the tiny dense model)'!r} is {family.name if family else 'dense'}")
    if mode == "R2" and not cfg.algorithm.recompute_logprobs:
        raise ValueError("actor.routing_replay=R2 records the routes in the trainer's recomputation of pi_old: set "
                         "algorithm.recompute_logprobs=true (or actor.routing_replay=R3, the rollout's routes)")
    if mode != "R2" or cfg.rollout.return_routes:
        check_returns_routes(cfg.rollout.engine, key)
    if cfg.actor.backend != "fsdp":
        raise ValueError(f"{key} is built into actor.backend=fsdp (got {cfg.actor.backend!r})")
    if cfg.actor.loop.share_prompt == "true":
        raise ValueError(f"{key} with actor.loop.share_prompt=true: a shared prompt's tokens are laid out once for "
                         "the group, the routes per row; set actor.loop.share_prompt=false")
    # where routes would not reach the batch whole, or the trainer's forward would not carry them
    engine_routes = mode != "R2" or cfg.rollout.return_routes  # R2's come from the trainer, whole
    unsupported = {"algorithm.recompute_by_length=true": cfg.algorithm.recompute_by_length,
                   f"runner.migrate_at={cfg.runner.migrate_at} (samples finished before a migration keep no routes)":
                       engine_routes and cfg.runner.migrate_at > 0,
                   "a multi-turn agent (its turns' routes are not joined into the episode)":
                       engine_routes and cfg.agent.multi_turn}
    for what, on in unsupported.items():
        if on:
            raise ValueError(f"{key} is not built for {what}")


def check_estimator(cfg: ReasoningConfig) -> None:
    """What the chosen advantage estimator declares decides which algorithm and critic keys make sense."""
    a = cfg.algorithm
    estimator = ADVANTAGE_ESTIMATORS.get(a.advantage)
    if a.kl_in_reward and (a.kl_beta <= 0 or not estimator.accepts_kl_in_reward):
        raise ValueError(f"algorithm.kl_in_reward needs algorithm.kl_beta > 0 and algorithm.advantage in "
                         f"{estimators_where(accepts_kl_in_reward=True)} (per-token rewards); "
                         f"with {estimators_where(accepts_kl_in_reward=False)} the KL is a loss term")
    if a.samples_per_prompt < 2 and build_estimator(a.advantage, a).needs_group():
        raise ValueError(f"algorithm.samples_per_prompt=1 with algorithm.advantage={a.advantage}: its advantage "
                         f"compares the samples of a prompt, so with one every advantage is 0 and nothing trains; "
                         f"set algorithm.samples_per_prompt >= 2, or an estimator that needs no group: "
                         f"{[n for n in ADVANTAGE_ESTIMATORS.names() if not build_estimator(n, a).needs_group()]}")
    changed = changed_keys(cfg.critic, CriticSection())
    if changed and not estimator.needs_critic:
        key, value = changed[0]
        raise ValueError(f"critic.{key}={value!r} configures the value model, which only algorithm.advantage="
                         f"{' or '.join(estimators_where(needs_critic=True))} launches (got {a.advantage})")
    for name in ADVANTAGE_ESTIMATORS.names():
        options = ADVANTAGE_ESTIMATORS.get(name).Options
        changed = [] if name == a.advantage or options is None else changed_keys(getattr(a, name), options())
        if changed:
            key, value = changed[0]
            raise ValueError(f"algorithm.{name}.{key}={value!r} is an option of algorithm.advantage={name}; "
                             f"algorithm.advantage={a.advantage} does not read it")


def check_teacher(cfg: ReasoningConfig) -> None:
    """`teacher.model_path`: set exactly when the estimator declares `needs_teacher`, and sharing the student's
    tokenizer and vocabulary size (the teacher scores the student's token ids), before any worker starts."""
    a, path = cfg.algorithm, cfg.teacher.model_path
    needs = ADVANTAGE_ESTIMATORS.get(a.advantage).needs_teacher
    readers = " or ".join(estimators_where(needs_teacher=True))
    if not needs:
        if path:
            raise ValueError(f"teacher.model_path={path!r} is read by algorithm.advantage={readers} only "
                             f"(got {a.advantage})")
        return
    if not path:
        raise ValueError(f"algorithm.advantage={a.advantage} needs teacher.model_path: a checkpoint that shares the "
                         f"student's tokenizer")
    vocab_size = read_hf_config(path, "teacher.model_path")["vocab_size"]
    student = f"model.path={cfg.model.path!r}" if cfg.model.path else "the tiny model (model.path empty)"
    if cfg.model.path:
        student_tokenizer, student_vocab = load_tokenizer(cfg.model.path), read_hf_config(cfg.model.path)["vocab_size"]
    else:
        student_tokenizer = char_tokenizer()
        student_vocab = len(student_tokenizer)
    theirs, ours = load_tokenizer(path, "teacher.model_path").get_vocab(), student_tokenizer.get_vocab()
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])
        raise ValueError(f"teacher.model_path={path!r}: its tokenizer is not the student's ({student}): "
                         f"{len(differ)} (token, id) pairs differ, e.g. {differ[:3]}; the teacher scores the student's "
                         f"token ids, so both must use one tokenizer")
    if vocab_size != student_vocab:
        raise ValueError(f"teacher.model_path={path!r} has vocab_size {vocab_size}, the student ({student}) "
                         f"{student_vocab}: the logprobs must be over one vocabulary")


def check_judge(cfg: ReasoningConfig) -> None:
    """reward.fn=judge: one judge, `judge.model_path` (our engine) or `judge.base_url` with `judge.model`; a rule
    reward to report beside it; the judge section set for another reward function is refused."""
    j, fn = cfg.judge, reward_config(cfg).fn
    if not needs_judge(fn):
        changed = changed_keys(j, JudgeConfig())
        if changed:
            raise ValueError(f"judge.{changed[0][0]}={changed[0][1]!r} is read by reward.fn=judge only "
                             f"(got reward.fn={cfg.reward.fn!r})")
        return
    if bool(j.model_path) == bool(j.base_url) or (j.base_url and not j.model):
        raise ValueError(f"reward.fn=judge needs one judge: judge.model_path (a checkpoint our engine serves) or "
                         f"judge.base_url with judge.model (an OpenAI-compatible server); got judge.model_path="
                         f"{j.model_path!r}, judge.base_url={j.base_url!r}, judge.model={j.model!r}")
    if j.model_path:
        read_hf_config(j.model_path, "judge.model_path")
    rules = [name for name in REWARD_FNS.names() if not needs_judge(name) and name != AUTO]
    if j.rule_fn not in rules:
        raise ValueError(f"judge.rule_fn={j.rule_fn!r} is not one of {rules}")


def changed_keys(section, defaults) -> list[tuple[str, object]]:
    """The (key, value) pairs of a dataclass section set away from `defaults`."""
    return [(f.name, getattr(section, f.name)) for f in fields(section)
            if getattr(section, f.name) != getattr(defaults, f.name)]


def refuse_unread_options(a, section: str, choice: str, registry) -> None:
    """A key of the `section` dataclass `a` set away from its default that only another choice of `<section>.<choice>`
    reads (each registered entry declares its `options`) is refused, naming both."""
    defaults, chosen = type(a)(), getattr(a, choice)
    readers: dict[str, list[str]] = {}
    for name in registry.names():
        for key in registry.get(name).options:
            readers.setdefault(key, []).append(name)
    for key, names in readers.items():
        if chosen not in names and getattr(a, key) != getattr(defaults, key):
            raise ValueError(f"{section}.{key}={getattr(a, key)!r} is an option of {section}.{choice}="
                             f"{' | '.join(names)}; {section}.{choice}={chosen} does not read it")


def check_off_policy(a: AlgorithmConfig, loss: LossConfig) -> None:
    """The policy loss and the importance correction by what they declare (`needs_proximal`: refused without
    the trainer's recomputed logprobs), the thresholds only the chosen correction reads, a non-empty range."""
    needs = {"algorithm.recompute_by_length": (a.recompute_by_length, a.recompute_by_length),
             "actor.loss.objective": (loss.objective, POLICY_LOSSES.get(loss.objective).needs_proximal),
             "actor.loss.is_correction": (loss.is_correction, IS_CORRECTIONS.get(loss.is_correction).needs_proximal)}
    for key, (value, needed) in needs.items():
        if needed and not a.recompute_logprobs:
            raise ValueError(f"{key}={value!r} is about the trainer's proximal logprobs: "
                             f"it needs algorithm.recompute_logprobs=true")
    refuse_unread_options(loss, "actor.loss", "is_correction", IS_CORRECTIONS)
    if loss.is_low >= loss.is_high:
        raise ValueError(f"actor.loss.is_low={loss.is_low} must be below actor.loss.is_high={loss.is_high}")



def check_config(cfg: ReasoningConfig) -> None:
    """Every check of a reasoning config, failing before any worker starts and naming the key: the schema's
    own (types, choices, bounds), then the registries' choices, then the checks across fields."""
    check_instance(cfg)
    check_choices(cfg)
    r, a = cfg.runner, cfg.algorithm
    check_estimator(cfg)
    check_teacher(cfg)
    check_judge(cfg)
    check_off_policy(a, cfg.actor.loss)
    check_data_config(cfg.data)
    check_schedule_options(r)
    check_reward_config(reward_config(cfg))
    check_loop(cfg.actor.loop, "actor.loop")
    check_actor_section(cfg)
    check_model(cfg)
    check_routing_replay(cfg, read_hf_config(cfg.model.path, "model.path") if cfg.model.path else None)
    if r.schedule != STATIC:
        SCHEDULES.get(r.schedule).check_config(cfg)
    check_agent(cfg)
    check_schedule_placement(cfg)


def check_schedule_options(r) -> None:
    """A `runner.*` key set away from its default that only another schedule reads (each declares its `options`)
    is refused, naming the schedules that read it."""
    defaults = type(r)()
    for name in SCHEDULES.names():
        for key in SCHEDULES.get(name).options:
            if r.schedule != name and getattr(r, key) != getattr(defaults, key):
                raise ValueError(f"runner.{key}={getattr(r, key)!r} is read by runner.schedule={name} only "
                                 f"(got runner.schedule={r.schedule!r})")


def tp_sizes_that_divide(heads: int, kv_heads: int) -> list[int]:
    return [tp for tp in range(1, kv_heads + 1) if heads % tp == 0 and kv_heads % tp == 0]


def check_model(cfg: ReasoningConfig) -> None:
    """The model the run would load: `model.path` a local folder or a hub id (its config.json read here), or
    the tiny model's sizes in the model section; the native engine's family known; every TP size dividing
    the attention heads and key/value heads, else refused naming the key and the sizes that would work."""
    m = cfg.model
    models = {"actor": (m.path, "model.path")}
    models["rollout"] = (cfg.rollout.model_path, "rollout.model_path") if cfg.rollout.model_path else models["actor"]
    checked: set[str] = set()  # one checkpoint's tensors are read once when actor and rollout share it
    for component, tp_key, tp in (("rollout", "rollout.tp_size", cfg.rollout.tp_size),
                                  ("actor", "actor.tp_size", cfg.actor.tp_size)):
        path, key = models[component]
        if path:
            hf = read_hf_config(path, key)
            if component == "rollout" and engine_class(cfg.rollout.engine).implements_families:
                ModelConfig.from_hf(hf, f"{key}={path!r}: rollout.engine=native",
                                    hint="use rollout.engine=hf or sglang")
            if path not in checked:
                check_checkpoint_tensors(path, hf, key)
                checked.add(path)
            heads = hf["num_attention_heads"]
            kv_heads = hf.get("num_key_value_heads") or heads
            where = f"{key}={path!r}"
        else:
            heads, kv_heads, where = m.num_heads, m.num_kv_heads, "model.num_heads / model.num_kv_heads"
        if tp > 1 and (heads % tp or kv_heads % tp):  # tp 0 (rollout: the whole group) is resolved at launch
            raise ValueError(f"{tp_key}={tp} must divide the model's {heads} attention heads and {kv_heads} "
                             f"key/value heads ({where}); TP sizes that would work: "
                             f"{tp_sizes_that_divide(heads, kv_heads)}")


def check_context(cfg: ReasoningConfig, longest_prompt: int | None) -> None:
    """The longest prompt (of those the run samples to size its cache) plus runner.max_new_tokens must fit the
    rollout's context: otherwise responses are cut short, and with a context the prompts fill, every reward is 0
    while the run looks healthy. None: multi-turn, whose context grows turn by turn (the episode ends at the
    context instead)."""
    from rlinf_like.runners.reasoning.memory import context_tokens

    if longest_prompt is None:
        return
    context, new = context_tokens(cfg), cfg.runner.max_new_tokens
    if longest_prompt + new > context:
        key = "rollout.max_context" if cfg.rollout.max_context else (
            "model.path's max_position_embeddings" if cfg.model.path else "model.max_positions")
        raise_it = "" if cfg.model.path and not cfg.rollout.max_context else \
            f"raise {key} to at least {longest_prompt + new}, or "
        raise ValueError(f"the longest prompt ({longest_prompt} tokens) plus runner.max_new_tokens={new} does not "
                         f"fit the rollout's context of {context} tokens ({key}): responses would be cut short; "
                         f"{raise_it}lower runner.max_new_tokens to at most {max(0, context - longest_prompt)}")


def check_checkpoint_tensors(path: str, hf: dict, key: str) -> None:
    """A local checkpoint of a family we implement: every tensor in its safetensors headers is one the family
    maps for its config.json, or the run is refused naming the tensors (never loaded with some dropped)."""
    if MODEL_FAMILIES.for_model_type(hf.get("model_type")) is None or not Path(path).is_dir() \
            or not any(Path(path).glob("*.safetensors")):
        return  # another architecture (the HF engine loads it) or a hub id: transformers reports its own keys
    model = ModelConfig.from_hf(hf, f"{key}={path!r}")
    check_checkpoint(model, checkpoint_names(path), f"{key}={path!r}")


def check_schedule_placement(cfg: ReasoningConfig) -> None:
    """A named schedule declares whether actor and rollout share devices; the placement must agree."""
    if cfg.runner.schedule == STATIC:
        return
    wanted = SCHEDULES.get(cfg.runner.schedule).shares_devices
    if share_devices(cfg.cluster.component_placement, "actor", "rollout") != wanted:
        raise ValueError(f"runner.schedule={cfg.runner.schedule} needs actor and rollout on "
                         f"{'the same' if wanted else 'different'} devices (cluster.component_placement.actor / "
                         f".rollout); runner.schedule=static picks the loop from the placement")



def check_finite(metrics: dict[str, float], step: int, policy: str) -> str | None:
    """The trainers never apply a non-finite gradient (the manager skips that optimizer step); this
    decides whether the run goes on. Returns the warning to log, or raises under policy "stop"."""
    skipped = {k: v for k, v in metrics.items() if k in ("skipped", "critic_skipped") and v > 0}
    if not skipped:
        return None
    detail = ", ".join(f"{k}={metrics[k]:.4g}" for k in ("loss", "grad_norm", "value_loss", "critic_grad_norm")
                       if k in metrics)
    message = (f"step {step}: non-finite loss or gradient norm ({detail}); the affected optimizer steps were "
               f"skipped (fraction {skipped}), weights unchanged")
    if policy == "stop":
        raise RuntimeError(message + "; stopping (runner.nonfinite=stop); the last checkpoint is intact")
    return message


def check_batch_split(cfg: ReasoningConfig, world_sizes: dict[str, int]) -> None:
    """Every data-parallel rank must run the same number of micro-batches (each one is a collective
    under FSDP). By rows, a step's rows must split evenly over ranks and mini-batches; with a token
    budget the plan deals every rank the same count, so each mini-batch only needs a row per rank."""
    rows = cfg.runner.prompts_per_step * cfg.algorithm.samples_per_prompt
    minis = cfg.actor.loop.mini_batches
    for component, world in world_sizes.items():
        if cfg.actor.loop.max_tokens_per_micro_batch is not None:
            if rows < world * minis:
                raise ValueError(
                    f"runner.prompts_per_step x algorithm.samples_per_prompt = {rows} rows per step cannot give "
                    f"each of {component} ranks ({world}) a row in each of actor.loop.mini_batches ({minis})")
        elif rows % (world * minis):
            raise ValueError(
                f"runner.prompts_per_step x algorithm.samples_per_prompt = {rows} rows per step do not divide by "
                f"{component} ranks ({world}) x actor.loop.mini_batches ({minis}); "
                f"pick sizes whose product is a multiple of {world * minis} (or set actor.loop.max_tokens_per_micro_batch)")
