"""Checkpoints: the hub, the tokenizer, the published layouts, loading and conversion."""
