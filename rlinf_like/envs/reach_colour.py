"""A multi-goal MuJoCo task: "reach the <colour> target".

A point mass (two slide joints, motors, damping) moves on a table with three coloured targets at
random places. The instruction names one colour; reaching it ends the episode with success,
reaching another ends it without. Reward: 10 x progress towards the named target, +1 on success.
Chance (a policy that reaches some target at random) succeeds 1/3 of the time.

obs_mode "state": "state" = agent pos, vel, the three target positions, one-hot colour (13).
obs_mode "pixels": "image" (top camera, uint8 HxWx3, rendered offscreen), "instruction" (token ids),
"state" = agent pos and vel (proprioception). The colour is then only in the words and the pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_like.envs.base import ActionSpec, FieldSpec, Obs, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.render import ensure_gl
from rlinf_like.envs.state import physics_state, rng_state, set_physics_state

COLOURS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.75, 0.1), "blue": (0.1, 0.2, 0.9)}
VOCAB = ("<pad>", "reach", "the", "target", *COLOURS)
INSTRUCTION_LEN = 4
ARENA, RADIUS, MIN_GAP = 0.3, 0.06, 0.2

_TARGET = """<body name="t{i}" mocap="true" pos="0 0 0.001">
  <geom type="cylinder" size="{r} 0.001" rgba="{rgb} 1" contype="0" conaffinity="0"/></body>"""
_XML = """<mujoco model="reach_colour">
  <option timestep="0.02"/>
  <visual><quality shadowsize="0"/><global offwidth="{framebuffer}" offheight="{framebuffer}"/></visual>
  <worldbody>
    <light pos="0 0 2" dir="0 0 -1" directional="true" castshadow="false"/>
    <geom type="plane" size="0.45 0.45 0.01" rgba="0.8 0.8 0.8 1"/>
    <camera name="top" pos="0 0 0.95" xyaxes="1 0 0 0 1 0" fovy="50"/>
    <body name="agent" pos="0 0 0.03">
      <joint name="x" type="slide" axis="1 0 0" damping="1" limited="true" range="-0.4 0.4"/>
      <joint name="y" type="slide" axis="0 1 0" damping="1" limited="true" range="-0.4 0.4"/>
      <geom type="sphere" size="0.03" rgba="0.1 0.1 0.1 1" mass="0.1" contype="0" conaffinity="0"/>
    </body>
    {targets}
  </worldbody>
  <actuator><motor joint="x" gear="1" ctrlrange="-1 1"/><motor joint="y" gear="1" ctrlrange="-1 1"/></actuator>
</mujoco>"""


def tokenize(text: str) -> np.ndarray:
    ids = [VOCAB.index(w) for w in text.lower().split()]
    return np.array(ids + [0] * (INSTRUCTION_LEN - len(ids)), dtype=np.int64)


class ReachColourEnv(VectorEnv):
    obs_modes = ("state", "pixels")

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> ReachColourEnv:
        unknown = sorted(set(cfg.kwargs) - {"frame_skip"})
        if unknown:
            raise ValueError(f"{name}: env.kwargs {unknown} are not options of reach_colour; allowed: ['frame_skip']")
        return cls(num_envs, name, cfg.obs_mode, cfg.image_size, cfg.max_episode_steps or 50, **cfg.kwargs)

    def __init__(self, num_envs: int, name: str = "env", obs_mode: str = "state", image_size: int = 48,
                 max_episode_steps: int = 50, frame_skip: int = 2):
        if obs_mode not in self.obs_modes:
            raise ValueError(f"{name}: obs_mode={obs_mode!r} is not one of {list(self.obs_modes)}")
        ensure_gl()
        import mujoco

        super().__init__(num_envs, name)
        targets = "\n".join(_TARGET.format(i=i, r=RADIUS, rgb=" ".join(map(str, c))) for i, c in enumerate(COLOURS.values()))
        # the offscreen framebuffer fits frame()'s GIF pictures (up to 4x the observation size)
        self.model = mujoco.MjModel.from_xml_string(_XML.format(size=image_size, framebuffer=4 * image_size,
                                                                targets=targets))
        self.data = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self.mujoco, self.obs_mode, self.image_size = mujoco, obs_mode, image_size
        self.max_steps, self.frame_skip = max_episode_steps, frame_skip
        self.rngs = [np.random.default_rng(i) for i in range(num_envs)]
        self.goal = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.dist = np.zeros(num_envs)
        self.renderer = mujoco.Renderer(self.model, image_size, image_size) if obs_mode == "pixels" else None
        n_colours = len(COLOURS)
        if obs_mode == "state":
            self.obs_spec = {"state": FieldSpec((4 + 2 * n_colours + n_colours,), "float32")}
        else:
            self.obs_spec = {"image": FieldSpec((image_size, image_size, 3), "uint8"),
                             "instruction": FieldSpec((INSTRUCTION_LEN,), "int64"),
                             "state": FieldSpec((4,), "float32")}
        self.action_spec = ActionSpec("continuous", (2,), (-1.0, -1.0), (1.0, 1.0))

    def instruction(self, i: int) -> str:
        return f"reach the {list(COLOURS)[self.goal[i]]} target"

    def _targets(self, i: int) -> np.ndarray:
        return self.data[i].mocap_pos[:, :2]

    def _reset_one(self, i: int, seed: int | None) -> Obs:
        if seed is not None:
            self.rngs[i] = np.random.default_rng(seed)
        rng, d = self.rngs[i], self.data[i]
        self.mujoco.mj_resetData(self.model, d)
        points: list[np.ndarray] = []
        while len(points) < len(COLOURS) + 1:  # targets, then the agent, pairwise apart
            p = rng.uniform(-ARENA, ARENA, 2)
            if all(np.linalg.norm(p - q) > MIN_GAP for q in points):
                points.append(p)
        d.mocap_pos[:, :2] = np.array(points[:-1])
        d.qpos[:] = points[-1]
        self.mujoco.mj_forward(self.model, d)
        self.goal[i] = rng.integers(len(COLOURS))
        self.t[i] = 0
        self.dist[i] = np.linalg.norm(d.qpos - self._targets(i)[self.goal[i]])
        return self._observe(i)

    def _observe(self, i: int) -> Obs:
        d = self.data[i]
        proprio = np.concatenate([d.qpos, d.qvel]).astype(np.float32)
        if self.obs_mode == "state":
            onehot = np.eye(len(COLOURS), dtype=np.float32)[self.goal[i]]
            return {"state": np.concatenate([proprio, self._targets(i).ravel(), onehot]).astype(np.float32)}
        self.renderer.update_scene(d, camera="top")
        return {"image": self.renderer.render().copy(), "instruction": tokenize(self.instruction(i)), "state": proprio}

    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        d = self.data[i]
        d.ctrl[:] = action
        self.mujoco.mj_step(self.model, d, nstep=self.frame_skip)
        self.t[i] += 1
        gaps = np.linalg.norm(self._targets(i) - d.qpos, axis=1)
        reward = 10.0 * (self.dist[i] - gaps[self.goal[i]])
        self.dist[i] = gaps[self.goal[i]]
        reached = np.flatnonzero(gaps < RADIUS)
        success = bool(len(reached)) and self.goal[i] in reached
        terminated = bool(len(reached))
        reward += 1.0 if success else 0.0
        truncated = not terminated and self.t[i] >= self.max_steps
        return self._observe(i), float(reward), terminated, truncated, {"is_success": float(success)}

    def expert_actions(self) -> np.ndarray:
        """A scripted expert with privileged state: full force towards the named target ([n, 2])."""
        return np.stack([np.clip((self._targets(i)[self.goal[i]] - self.data[i].qpos) / 0.05, -1, 1)
                         for i in range(self.num_envs)])

    def _get_env_state(self, i: int) -> dict:
        return {"physics": physics_state(self.model, self.data[i]), "rng": rng_state(self.rngs[i]),
                "goal": int(self.goal[i]), "t": int(self.t[i]), "dist": float(self.dist[i])}

    def _set_env_state(self, i: int, state: dict) -> None:
        set_physics_state(self.model, self.data[i], state["physics"])
        self.rngs[i].bit_generator.state = state["rng"]
        self.goal[i], self.t[i], self.dist[i] = state["goal"], state["t"], state["dist"]

    def frame(self, i: int = 0, size: int = 128) -> np.ndarray:
        """A larger picture of env i, for GIFs."""
        renderer = self.mujoco.Renderer(self.model, min(size, self.image_size * 4), min(size, self.image_size * 4))
        renderer.update_scene(self.data[i], camera="top")
        return renderer.render().copy()
