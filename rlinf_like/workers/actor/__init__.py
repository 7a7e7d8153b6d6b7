"""The trained policy: ActorWorker on a ModelManager, and its RL loss."""
