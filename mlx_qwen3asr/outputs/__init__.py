"""Results to files: subtitle cues, rendered documents (TXT, SRT, VTT, JSON), and folder runs: finding
inputs, naming outputs, resuming, writing them (through runtime/atomic.py's crash-safe files)."""
