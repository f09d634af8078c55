"""`mlxasr serve`: an OpenAI-compatible transcription server (mlx_qwen3asr.serve.app) run with uvicorn.

mlxasr serve --model Qwen/Qwen3-ASR-0.6B --port 8000
curl -F file=@talk.wav -F model=qwen3-asr http://127.0.0.1:8000/v1/audio/transcriptions
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from mlx_qwen3asr import tune_malloc
from mlx_qwen3asr.cli.browser import open_page
from mlx_qwen3asr.cli.diarizing import (
    Diarization,
    Unavailable,
    add_diarization,
    check_diarization,
)
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.library import add_library_options, open_library
from mlx_qwen3asr.cli.loading import load_in_order
from mlx_qwen3asr.cli.options import (
    ALIGNER_ENV,
    DEFAULT_ALIGNER,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    add_batch_size,
    add_model,
    add_speech_detection,
    check_vad,
    exit_status,
    int_in,
    number_in,
    vad_options,
)
from mlx_qwen3asr.cli.signals import terminate
from mlx_qwen3asr.cli.stdio import open_closed_standard_streams, problem_line
from mlx_qwen3asr.library.store import LibraryError
from mlx_qwen3asr.runtime.messages import one_line

PROG = "mlxasr serve"
APP_PROG = "mlxasr app"
API_KEY_ENV = "MLXASR_API_KEY"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_UPLOAD_MB = 25.0
DEFAULT_MAX_QUEUE_SECONDS = 3600.0
DEFAULT_MAX_AUDIO_SECONDS = 3600.0
DEFAULT_HEADER_TIMEOUT = 20.0
DEFAULT_BODY_TIMEOUT = 20.0
DEFAULT_BODY_MIN_RATE = 4096.0
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_LIVE_SESSIONS = 4
DEFAULT_MAX_LIVE_SECONDS = 3600.0
DEFAULT_LIVE_IDLE_TIMEOUT = 30.0
DEFAULT_MAX_LIVE_BUFFER_SECONDS = 30.0
UPLOAD_MB_RANGE = (0.001, 1_000_000.0)
QUEUE_SECONDS_RANGE = (0.0, 10_000_000.0)
AUDIO_SECONDS_RANGE = (0.001, 10_000_000.0)
TIMEOUT_RANGE = (0.01, 86_400.0)
MIN_RATE_RANGE = (1.0, 1e12)
CONNECTIONS_RANGE = (1, 1_000_000)
LIVE_SESSIONS_RANGE = (0, 10_000)

DESCRIPTION = """\
Serve transcription over HTTP with the API of OpenAI's /v1/audio/transcriptions, so that OpenAI
clients work against it unchanged. The model (and the forced aligner, for word timestamps) is loaded
once; concurrent requests share its decoding batch. Listens on 127.0.0.1 unless --host says otherwise."""

APP_DESCRIPTION = """\
Open the web page: drop recordings, search the transcript library, read along with the audio,
correct, name speakers, export, live captions from the microphone. Starts the server (as mlxasr
serve, with the library) on a free port of this machine and opens the page in the default browser."""

EPILOG = f"""\
endpoints:
  POST /v1/audio/transcriptions   form fields: file, model (any value), language, prompt,
                                  response_format (json, text, srt, vtt, verbose_json, and
                                  diarized_json with --diarize), timestamp_granularities[]
                                  (segment, word), temperature (accepted, ignored: decoding is
                                  greedy), stream (server-sent events), known_speaker_names[]
  GET  /v1/models                 the loaded model
  GET  /health                    status and the audio waiting
  GET  /v1/realtime/transcription WebSocket: 16 kHz 16-bit PCM in, partial and committed text out
                                  as JSON events (see docs/server.md)

example:
  mlxasr serve --port 8000 --api-key secret
  curl -H "Authorization: Bearer secret" -F file=@talk.wav -F model=qwen3-asr \\
       -F response_format=srt http://127.0.0.1:8000/v1/audio/transcriptions

exit status:
  {EXIT_OK}    the server was stopped
  {EXIT_USAGE}    usage error, the address cannot be listened on, the model (or a named aligner) could
       not be loaded, --diarize without its extra or its model files
  {EXIT_INTERRUPTED}  stopped with Ctrl-C ({EXIT_TERMINATED} for SIGTERM); requests in flight are cancelled"""


def build_parser(app: bool = False) -> argparse.ArgumentParser:
    """The options of `mlxasr serve`; app: those of `mlxasr app` (any free port, the page opened)."""
    port = 0 if app else DEFAULT_PORT
    p = argparse.ArgumentParser(
        prog=APP_PROG if app else PROG,
        description=APP_DESCRIPTION if app else DESCRIPTION,
        epilog=None if app else EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default: {DEFAULT_HOST})")
    p.add_argument(
        "--port",
        type=int_in((0, 65535)),
        default=port,
        help=f"port (default: {port or 'any free one'}; 0: any free one)",
    )
    if app:
        p.add_argument(
            "--no-browser", action="store_true", help="print the page's address without opening a browser"
        )
    add_model(p)
    words = p.add_mutually_exclusive_group()
    words.add_argument(
        "--aligner",
        default=None,
        metavar="A",
        help=f"forced aligner for word timestamps (default: ${ALIGNER_ENV} or {DEFAULT_ALIGNER}); a named one "
        "must load, without the default one word timestamps are refused",
    )
    words.add_argument(
        "--no-aligner", action="store_true", help="load no forced aligner: word timestamps are refused"
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on every request (default: ${API_KEY_ENV}; none: open)",
    )
    p.add_argument(
        "--max-upload-mb",
        type=number_in(UPLOAD_MB_RANGE, "MB"),
        default=DEFAULT_MAX_UPLOAD_MB,
        metavar="N",
        help=f"largest request body in MB (MiB), refused with 413 (default: {DEFAULT_MAX_UPLOAD_MB:g})",
    )
    p.add_argument(
        "--max-queue-seconds",
        type=number_in(QUEUE_SECONDS_RANGE, "seconds"),
        default=DEFAULT_MAX_QUEUE_SECONDS,
        metavar="S",
        help="refuse new requests (503 with Retry-After) while more than S seconds of audio are being "
        f"transcribed or waiting (default: {DEFAULT_MAX_QUEUE_SECONDS:g})",
    )
    p.add_argument(
        "--max-audio-seconds",
        type=number_in(AUDIO_SECONDS_RANGE, "seconds"),
        default=DEFAULT_MAX_AUDIO_SECONDS,
        metavar="S",
        help="longest audio one request may hold, counted as decoded; longer is refused with 413 "
        f"(default: {DEFAULT_MAX_AUDIO_SECONDS:g})",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients may use in the Host header, besides localhost, 127.0.0.1, [::1] and "
        "--host (and any IP address and this machine's name when --host is 0.0.0.0 or ::); repeatable; "
        "'*' accepts any. Others get 421 (this stops DNS-rebinding pages)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (e.g. https://app.example) allowed to make cross-origin requests, "
        "answered with CORS headers; repeatable; '*' allows any. Requests from other origins get 403",
    )
    p.add_argument(
        "--header-timeout",
        type=number_in(TIMEOUT_RANGE, "seconds"),
        default=DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help="seconds a connection has to send its request headers; then 408 and closed "
        f"(default: {DEFAULT_HEADER_TIMEOUT:g})",
    )
    p.add_argument(
        "--body-timeout",
        type=number_in(TIMEOUT_RANGE, "seconds"),
        default=DEFAULT_BODY_TIMEOUT,
        metavar="S",
        help="longest pause in a request body; then 408 and closed, the upload dropped (live WebSocket "
        f"sessions have their own bounds instead) (default: {DEFAULT_BODY_TIMEOUT:g})",
    )
    p.add_argument(
        "--body-min-rate",
        type=number_in(MIN_RATE_RANGE, "bytes a second"),
        default=DEFAULT_BODY_MIN_RATE,
        metavar="B",
        help="bytes a second a request body must average after its first --body-timeout seconds "
        f"(default: {DEFAULT_BODY_MIN_RATE:g})",
    )
    p.add_argument(
        "--max-connections",
        type=int_in(CONNECTIONS_RANGE),
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="open connections at most, WebSockets included; more get 503 "
        f"(default: {DEFAULT_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--max-live-sessions",
        type=int_in(LIVE_SESSIONS_RANGE),
        default=DEFAULT_MAX_LIVE_SESSIONS,
        metavar="N",
        help="live WebSocket sessions at once; more are refused with an error event and close code 1013 "
        f"(default: {DEFAULT_MAX_LIVE_SESSIONS}; 0: no live sessions)",
    )
    p.add_argument(
        "--max-live-seconds",
        type=number_in(AUDIO_SECONDS_RANGE, "seconds"),
        default=DEFAULT_MAX_LIVE_SECONDS,
        metavar="S",
        help="longest live session, in audio received and in time connected; then an error event and "
        f"closed (default: {DEFAULT_MAX_LIVE_SECONDS:g})",
    )
    p.add_argument(
        "--live-idle-timeout",
        type=number_in(TIMEOUT_RANGE, "seconds"),
        default=DEFAULT_LIVE_IDLE_TIMEOUT,
        metavar="S",
        help="a live session whose client sends nothing for S seconds gets an error event and is closed "
        f"(default: {DEFAULT_LIVE_IDLE_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-live-buffer-seconds",
        type=number_in(AUDIO_SECONDS_RANGE, "seconds"),
        default=DEFAULT_MAX_LIVE_BUFFER_SECONDS,
        metavar="S",
        help="audio a live session may have waiting for the model; more (sent faster than it is "
        f"transcribed) ends the session (default: {DEFAULT_MAX_LIVE_BUFFER_SECONDS:g})",
    )
    add_library_options(p)
    add_batch_size(p, "from all requests", "")
    add_speech_detection(p)
    add_diarization(
        p,
        speaker_format=False,
        counts=False,
        what="load a speaker diarizer for the whole server: response_format diarized_json names who "
        "speaks each segment (without it such requests get a 400)",
    )
    return p


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, bound before the model loads so that a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def _model_id(source: str) -> str:
    """The name the API gives the model: a repo id as it is, a local folder by its name only."""
    path = Path(source).expanduser()
    return path.resolve().name if path.exists() else source


class _Stderr:
    """What the server says before it serves (and when it cannot): lines on stderr."""

    def info(self, line: str) -> None:
        print(line, file=sys.stderr)

    def error(self, line: str) -> None:
        print(problem_line(PROG, "error", one_line(line)), file=sys.stderr)

    def warning(self, line: str) -> None:
        print(problem_line(PROG, "warning", one_line(line)), file=sys.stderr)


_say = _Stderr()
_error, _warning = _say.error, _say.warning


def _api_key(flag: str | None) -> str | None:
    """The key every request must send: --api-key, else $MLXASR_API_KEY, else None (an open server).

    An empty one is refused (ValueError) rather than taken as "no key": `--api-key "$KEY"` with KEY
    unset would otherwise open the server, even with $MLXASR_API_KEY set."""
    if flag is not None:
        if not flag.strip():
            raise ValueError(
                "--api-key is empty (an unset shell variable?): give the key, or leave the option out "
                f"to use ${API_KEY_ENV}"
            )
        return flag
    value = os.environ.get(API_KEY_ENV)
    if value is not None and not value.strip():
        raise ValueError(f"${API_KEY_ENV} is set but empty: give it a key, or unset it to serve without one")
    return value


def _raise_open_files(connections: int) -> None:
    """Raise the soft limit on open files to what the connections need (and some for the rest), where
    the hard limit allows: each connection is a descriptor, and macOS starts at 256."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = connections + 256
        if soft != resource.RLIM_INFINITY and soft < wanted:
            top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            if top > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
    except (ImportError, ValueError, OSError):
        pass


def _load_models(args: argparse.Namespace, diarization: Diarization | None = None):
    """(model, aligner or None, why word timestamps are unavailable, diarizer or None) or an exit status.
    The diarizer loads first: a library that cannot run stops the server before any model loads."""
    # Its runs in a worker process: a client that leaves stops its diarization at once.
    loaded = load_in_order(
        args,
        _say,
        diarization=diarization,
        isolated=True,
        aligner=None if args.no_aligner else "word timestamps refused; use --aligner PATH or --no-aligner",
    )
    if loaded is None:
        return EXIT_USAGE
    model, diarizer = loaded.model, loaded.diarizer
    if loaded.aligner is None:
        return model, None, "it was started with --no-aligner", diarizer
    if loaded.aligner.model is None:
        return (
            model,
            None,
            f"the forced aligner {_model_id(loaded.aligner.source)} could not be loaded",
            diarizer,
        )
    return model, loaded.aligner.model, None, diarizer


def _serve(args: argparse.Namespace, exiting: bool, diarization: Diarization | None = None) -> int:
    try:
        sock = _listen(args.host, args.port)
    except OSError as e:
        _error(f"cannot listen on {args.host}:{args.port} ({(e.strerror or str(e)).lower()})")
        return EXIT_USAGE
    engine = speakers = diarizer = library = uploads = None
    try:
        library = open_library(args, _error, jobs=True)
        if isinstance(library, int):
            return library
        loaded = _load_models(args, diarization)
        if isinstance(loaded, int):
            return loaded
        model, aligner, words_unavailable, diarizer = loaded

        import uvicorn

        from mlx_qwen3asr.pipeline.engine import Engine
        from mlx_qwen3asr.serve.app import ConnectionLimits, LiveLimits, Speakers, create_app, uvicorn_config
        from mlx_qwen3asr.serve.uploads import upload_folder

        engine = Engine(model, aligner=aligner, batch_size=args.batch_size, vad=vad_options(args) or False)
        if diarizer is not None:
            speakers = Speakers(diarizer, diarization.lib, diarization.options)
        api_key = args.api_key
        # The server's own, removed below however it stops (even before the app has started).
        uploads = upload_folder()
        try:
            app = create_app(
                engine,
                model_id=_model_id(args.model),
                api_key=api_key,
                max_upload_bytes=int(args.max_upload_mb * 1024 * 1024),
                max_queue_seconds=args.max_queue_seconds,
                max_audio_seconds=args.max_audio_seconds,
                upload_dir=uploads,
                words_unavailable=words_unavailable,
                host=args.host,
                allowed_hosts=args.allowed_host,
                cors_origins=args.cors_origin,
                live=LiveLimits(
                    max_sessions=args.max_live_sessions,
                    max_seconds=args.max_live_seconds,
                    idle_timeout=args.live_idle_timeout,
                    max_buffer_seconds=args.max_live_buffer_seconds,
                ),
                speakers=speakers,
                library=library,
                max_job_upload_bytes=int(args.max_job_upload_mb * 1024 * 1024),
            )
        except LibraryError as e:  # another server took the library meanwhile
            _error(one_line(e))
            return EXIT_USAGE
        limits = ConnectionLimits(
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            body_min_rate=args.body_min_rate,
            max_connections=args.max_connections,
        )
        _raise_open_files(limits.max_connections)
        host, port = sock.getsockname()[:2]
        if api_key is None and host not in ("127.0.0.1", "::1", "localhost"):
            _warning(
                f"listening on {host} without an API key: anyone who can reach it can use it (--api-key)"
            )
        shown = f"[{host}]" if ":" in host else host
        print(
            f"listening on http://{shown}:{port} (model {_model_id(args.model)})", file=sys.stderr, flush=True
        )
        if getattr(args, "no_browser", None) is not None:  # mlxasr app
            open_page(f"http://{shown}:{port}/", not args.no_browser, _warning)
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
        config = uvicorn_config(app, limits, log_level="info", timeout_graceful_shutdown=5)
        uvicorn.Server(config).run(sockets=[sock])
        return EXIT_OK
    finally:
        sock.close()
        if speakers is not None:
            speakers.close()
        if callable(getattr(diarizer, "close", None)):  # its worker process ends with the server
            diarizer.close()
        if engine is not None and not exiting:
            engine.close()
        if library is not None and not isinstance(library, int) and not exiting:
            library.close()
        if uploads is not None:
            shutil.rmtree(uploads, ignore_errors=True)


def main(argv: Sequence[str] | None = None, *, exiting: bool = False, app: bool = False) -> int:
    """Run `mlxasr serve` with the given arguments (default: sys.argv[1:]); returns the exit status.

    exiting: the process ends right after (the command): the engine's thread is left as it is rather
    than stopped, since MLX can abort a process whose threads that used it end during its exit; the
    caller then leaves with os._exit."""
    parser = build_parser(app)
    try:
        args = parser.parse_args(argv)
        if app and args.no_library:
            parser.error("--no-library: the page keeps its transcripts in the library")
        check_vad(parser, args)
        diarization = check_diarization(parser, args)
    except SystemExit as e:  # usage errors and --help
        return exit_status(e)
    except Unavailable as e:
        _error(str(e))
        return EXIT_USAGE
    try:
        args.api_key = _api_key(args.api_key)
    except ValueError as e:
        _error(str(e))
        return EXIT_USAGE
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    # The server stops on Ctrl-C (uvicorn catches SIGINT, shuts down, then raises it again with the
    # handler it found): with SIGINT ignored from the start (a background job of a shell without job
    # control) that would end in status 0, so the interrupt handler is set here.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    try:
        return stopped(parser.prog, lambda: _serve(args, exiting, diarization))
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def entry() -> None:
    """Run the server as a command: main(), then leave at once with its status."""
    open_closed_standard_streams()  # before any file is opened: none may take fd 0, 1 or 2
    tune_malloc()
    status = main(exiting=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    entry()
