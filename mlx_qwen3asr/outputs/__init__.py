"""Results to files: subtitle cues (cues.py, from the aligner's words: word_cues.py; their types and
limits: cue_types.py; line wrapping: wrapping.py), rendered documents (TXT, SRT, VTT, JSON: render.py),
folder runs: finding inputs, naming outputs, resuming, and writing a file's outputs, each complete or
untouched (folder.py, through runtime/atomic.py), and the outputs of a live transcript that grows, each
commit appended in one write that a failure undoes (appending.py)."""
