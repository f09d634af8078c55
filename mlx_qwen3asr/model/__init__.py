"""The model itself: configuration, the MLX modules, and greedy decoding: prefill, the decoding batch,
decoding after a draft, and the entry points (generate.py)."""
