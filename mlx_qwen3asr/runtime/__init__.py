"""Where the package runs: the GPU or CPU code path and its settings, and the CPU process setup."""
