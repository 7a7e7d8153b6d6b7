"""rlinf_like: reinforcement-learning post-training for LLMs and embodied policies on Ray."""

__version__ = "0.1.0"
