"""Command-line tools: `mlxasr` (main.py) transcribes files and folders to TXT, SRT, VTT, JSON and RTTM, with
its options in arguments.py, the run in run.py and plan.py, speakers told apart in diarizing.py and
diarize_queue.py (the pairing of transcriptions and speakers; the diarizer's queue is
mlx_qwen3asr.diarize.queue), and its messages in reporter.py and bar.py; `mlxasr serve` (serve.py) runs
the transcription server, live over its WebSocket too; `mlxasr live` (live.py) transcribes the
microphone, a stream or a file live on the terminal, with its audio sources (live_sources.py), display
(live_display.py), outputs' names and lock (live_plan.py, live_names.py), files (live_outputs.py), Ctrl-C
(live_stop.py) and error (live_error.py), the session itself being mlx_qwen3asr.pipeline.live_session;
`mlxasr align` (align.py) times a transcript the user has; `mlxasr-convert` (convert.py) converts
checkpoints. options.py, models.py, loading.py (the order models load in), exits.py (how a command ends),
signals.py and stdio.py hold what the commands share."""
