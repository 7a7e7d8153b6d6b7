"""Frozen-model logprobs (KL reference, recomputed old logprobs)."""
