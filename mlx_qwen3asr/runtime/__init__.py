"""Where the package runs: its settings and default dtype, the CPU process setup (OpenBLAS, malloc),
and crash-safe file writing."""
