"""Text around the model: languages, contexts, prompts and output parsing, the items the aligner times
(words.py) with the Korean dictionary their cut needs, the spans they show as (spans.py) and their
times from the aligner's classes (timestamps.py)."""
