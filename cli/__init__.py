"""Command-line tools; `mlxasr` (cli/main.py) transcribes files and folders to TXT, SRT, VTT and JSON."""
