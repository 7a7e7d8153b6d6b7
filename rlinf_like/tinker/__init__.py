"""A Tinker-compatible local server: `python -m rlinf_like.tinker serve --model PATH`. Unmodified `tinker` clients
train a LoRA model on our actor and sample from our native engine (`service.py`, `server.py`)."""
