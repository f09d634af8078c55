"""Where the package runs: the GPU or CPU code path and its settings, the CPU process setup, and
crash-safe file writing."""
