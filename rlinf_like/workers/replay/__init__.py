from rlinf_like.workers.replay.worker import ReplayWorker, Samples

__all__ = ["ReplayWorker", "Samples"]
