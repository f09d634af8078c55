"""Text around the model: languages, contexts, prompts and output parsing, the items the aligner times
and the Korean dictionary their cut needs."""
