"""The env <-> rollout wire: fixed-layout messages over the pair's peer group (gloo on CPU).

Both sides know the layout from the env's specs, so one message is one uint8 buffer (one send):
env -> rollout carries a `StepMessage` (obs, reward, terminated, truncated, the final obs of truncated
envs) as the flat fields of `step_layout`;
rollout -> env carries the env actions as float64. Sends are posted (non-blocking) so neither side
can deadlock on the other's order; `flush` waits for them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlinf_like.envs.base import FieldSpec
from rlinf_like.workers.env.types import StepMessage

ALIGN = 8


@dataclass(frozen=True)
class Layout:
    fields: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, numpy dtype)

    def offsets(self) -> list[int]:
        out, pos = [], 0
        for _, shape, dtype in self.fields:
            out.append(pos)
            pos += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
        return out + [pos]

    def pack(self, values: dict[str, np.ndarray]) -> torch.Tensor:
        offsets = self.offsets()
        buf = np.zeros(offsets[-1], dtype=np.uint8)
        for (name, shape, dtype), off in zip(self.fields, offsets):
            raw = np.ascontiguousarray(values[name], dtype=dtype).reshape(shape).view(np.uint8).ravel()
            buf[off:off + raw.size] = raw
        return torch.from_numpy(buf)

    def empty(self) -> torch.Tensor:
        return torch.empty(self.offsets()[-1], dtype=torch.uint8)

    def unpack(self, buf: torch.Tensor) -> dict[str, np.ndarray]:
        arr, out = buf.numpy(), {}
        for (name, shape, dtype), off in zip(self.fields, self.offsets()):
            size = int(np.prod(shape)) * np.dtype(dtype).itemsize
            out[name] = arr[off:off + size].view(dtype).reshape(shape)
        return out


def step_layout(obs_spec: dict[str, FieldSpec], n: int) -> Layout:
    """The wire form of a `StepMessage` of `n` envs (its fields named as `step_fields` names them)."""
    obs = [(k, (n, *s.shape), s.dtype) for k, s in obs_spec.items()]
    final = [(f"final_{k}", shape, dtype) for k, shape, dtype in obs]
    meta = [("reward", (n,), "float32"), ("terminated", (n,), "bool"), ("truncated", (n,), "bool")]
    return Layout(tuple(obs + meta + final))


def action_layout(shape: tuple[int, ...]) -> Layout:
    return Layout((("actions", shape, "float64"),))


class Link:
    """One end of the wire to a peer rank (`peer`) of the peer group."""

    def __init__(self, group, peer: int):
        self.group, self.peer = group, peer
        self._pending: list = []

    def send(self, layout: Layout, values: dict[str, np.ndarray]) -> None:
        buf = layout.pack(values)
        self._pending.append((self.group.post_send(buf, self.peer), buf))  # keep buf alive until sent
        if len(self._pending) > 8:
            self.flush(keep=4)

    def recv(self, layout: Layout) -> dict[str, np.ndarray]:
        return layout.unpack(self.group.recv(layout.empty(), self.peer))

    def send_step(self, layout: Layout, msg: StepMessage) -> None:
        self.send(layout, step_fields(msg))

    def recv_step(self, layout: Layout, obs_keys) -> StepMessage:
        return read_step(self.recv(layout), obs_keys)

    def flush(self, keep: int = 0) -> None:
        while len(self._pending) > keep:
            work, _ = self._pending.pop(0)
            self.group.wait(work)


def step_fields(msg: StepMessage) -> dict[str, np.ndarray]:
    return {**msg.obs, **{f"final_{k}": v for k, v in msg.final_obs.items()}, "reward": msg.reward,
            "terminated": msg.terminated, "truncated": msg.truncated}


def read_step(fields: dict[str, np.ndarray], obs_keys) -> StepMessage:
    return StepMessage({k: fields[k] for k in obs_keys}, {k: fields[f"final_{k}"] for k in obs_keys},
                       fields["reward"], fields["terminated"], fields["truncated"])
