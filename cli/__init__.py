"""Command-line tools: `mlxasr` (main.py) transcribes files and folders to TXT, SRT, VTT and JSON, with its
options in arguments.py, the run in run.py and plan.py and its messages in reporter.py; `mlxasr serve`
(serve.py) runs the transcription server; `mlxasr-convert` (convert.py) converts checkpoints. options.py,
models.py and signals.py hold what the commands share."""
