"""TrainedWorker: the verbs every worker that owns a ModelManager shares — weight publishing to a
rollout, offload / onload, checkpoints, HF export, status — written once for actor, critic and the
embodied actor. One base class over Worker, no mixins."""

from __future__ import annotations

from rlinf_like.hybrid_engines.lora_sync import AdapterSpec
from rlinf_like.hybrid_engines.model_manager import ModelManager
from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout, WeightSender
from rlinf_like.hybrid_engines.residency import turn_moves
from rlinf_like.runtime import Worker


class TrainedWorker(Worker):
    manager: ModelManager  # set by the subclass's __init__
    _sender: WeightSender | None = None

    # --- weights to the rollout -----------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        return self.manager.shard_layouts()

    def adapter_spec(self) -> AdapterSpec | None:
        """Under LoRA, the `AdapterSpec` the rollout merges received adapters with; else None."""
        return self.manager.adapter_spec()

    def changing_tensors(self) -> list[str] | None:
        """The synced tensors training can change, when fewer than all (LoRA); for `SyncPlan.build(changing=)`."""
        return self.manager.changing_tensors()

    def connect_weights(self, peer_group: str, plan: SyncPlan, transport: str = "group") -> None:
        self._sender = WeightSender(self.peer_group(peer_group), plan, self.rank, transport)

    def publish_weights(self, version: int) -> int:
        """Sends `version`; returns the bytes this rank sent."""
        if self._sender is None:
            raise RuntimeError(f"{self.name}: publish_weights before connect_weights")
        return self._sender.publish(version, self.manager.named_shards())

    # --- memory, checkpoints ----------------------------------------------------------------------------
    def offload(self, force: bool = False) -> int:
        """Hand the device to a collocated peer; returns the bytes moved to host memory: 0 on CPU, where nothing
        moves unless `force` (`residency.turn_moves`)."""
        if not turn_moves(self.torch_device, force):
            return 0
        return sum(move.bytes for move in self.manager.offload())

    def onload(self) -> int:
        """Take the device back; returns the bytes moved (0 when nothing was offloaded)."""
        return sum(move.bytes for move in self.manager.onload())

    def save(self, path: str) -> None:
        self.manager.save(path)

    def load(self, path: str) -> None:
        self.manager.load(path)

    def export_hf(self, path: str) -> None:
        self.manager.export_hf(path)

    def status(self) -> dict:
        s = self.manager.get_status()
        return {"step": s.step, "lr": s.lr}
