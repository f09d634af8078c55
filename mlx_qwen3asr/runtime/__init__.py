"""Where the package runs: what differs by device (the batch sizes, the default dtype: device.py), the
CPU process setup (OpenBLAS, malloc), crash-safe writing of files and folders, one-line messages."""
