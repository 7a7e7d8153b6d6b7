"""Embodied RL: the PPO runner (`runner.py`), the SAC rounds (`sac.py`), their schema (`config.py`) and the
final policy's GIF (`media.py`)."""
