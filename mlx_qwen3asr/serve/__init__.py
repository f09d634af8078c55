"""The OpenAI-compatible HTTP server: /v1/audio/transcriptions in every response format (streamed as
server-sent events where asked), speakers for diarized_json, and live transcription over the realtime
WebSocket; who it answers (Host, Origin, API key) checked the same way for both."""
