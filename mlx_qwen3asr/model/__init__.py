"""The model itself, modules only: the configuration (config.py), the MLX modules (the audio encoder, the
text decoder and its key/value cache, the thinker that joins them: encoder.py, decoder.py, cache.py,
qwen3asr.py), and greedy decoding: prefill (prefill.py), the decoding batch (batch.py) and its step,
compiled once per shape and replayed (step.py), decoding after a draft, which makes a live step cheap
(draft.py), and the entry points (generate.py). One code path on every device: MLX's own operations
and fused kernels."""
