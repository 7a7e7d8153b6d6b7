from rlinf_like.workers.env.types import CollectResult, EnvSpecs, EnvStats, StepMessage
from rlinf_like.workers.env.worker import EnvWorker, episode_metrics

__all__ = ["CollectResult", "EnvSpecs", "EnvStats", "EnvWorker", "StepMessage", "episode_metrics"]
