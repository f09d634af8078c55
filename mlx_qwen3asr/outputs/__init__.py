"""Results to files: subtitle cues, rendered documents, crash-safe writing, folder runs."""
