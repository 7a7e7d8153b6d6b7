"""Evaluations on recognized benchmarks, runnable on any checkpoint (`python -m rlinf_like.eval.ifeval MODEL`)."""
