"""The model itself: configuration, MLX modules, the CPU kernels and greedy decoding."""
