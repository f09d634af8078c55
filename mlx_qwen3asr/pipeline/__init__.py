"""Inputs to results: preparing inputs, the batching scheduler, word timing, the engine and transcribe()."""
