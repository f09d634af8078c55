"""Where the package runs: its settings and default dtype, the CPU process setup (OpenBLAS, malloc),
crash-safe writing of files and folders, one-line messages."""
