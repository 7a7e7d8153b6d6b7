from rlinf_like.workers.env.worker import EnvWorker, episode_metrics

__all__ = ["EnvWorker", "episode_metrics"]
