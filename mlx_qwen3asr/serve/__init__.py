"""The OpenAI-compatible HTTP server (app.py): /v1/audio/transcriptions in every response format (openai.py,
streamed as server-sent events where asked), uploads read to a private folder (uploads.py), speakers for
diarized_json on the diarizer queue the commands share too (speakers.py), a full queue refused with a
Retry-After (load.py), and live transcription over the realtime WebSocket (live.py, its events:
live_events.py, its bounds live_limits.py, a finished session filed in the library live_save.py); the
transcript library's jobs and transcripts (library_api.py, library_jobs.py, library_common.py); the web
page at / (page.py, serving web/: plain HTML, CSS and ES modules); who it answers (Host, Origin, API key) checked the same way for both (access.py), its
connections bounded (connections.py)."""
