from rlinf_like.workers.critic.worker import CriticConfig, CriticWorker, token_values, value_model_loss

__all__ = ["CriticConfig", "CriticWorker", "token_values", "value_model_loss"]
