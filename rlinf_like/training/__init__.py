"""Training-side batch handling every trained role shares: the training loop (epochs x mini-batches x
micro-batches, `loop.py`), micro-batch planning by rows or token budget (`micro_batching.py`) and the
pipeline mode's batch resizer (`batch_resizer.py`). Workers call these; they hold no Ray code."""
