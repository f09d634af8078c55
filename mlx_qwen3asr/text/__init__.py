"""Text around the model: languages, prompts and output parsing, the items the aligner times."""
