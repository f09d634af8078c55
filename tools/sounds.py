"""Sounds with known speech: espeak-ng sentences between stretches of noise, music-like tones and
silence, the truth known to the sample. Used by the speech-detection tests, tools/vad_compare.py and
tools/bench.py (`--mode vad`)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

RATE = 16000
SENTENCES = [
    ("en", "The committee will meet again on Thursday to review the budget for next year."),
    ("en-us+f3", "Please remember to bring your notebook and a pencil to the exam tomorrow morning."),
    ("de", "Der Zug nach Berlin fährt heute wegen einer Störung eine halbe Stunde später ab."),
    ("fr", "Nous avons passé une excellente soirée au bord de la mer avec nos amis."),
    ("es", "El mercado abre a las ocho y cierra poco después del mediodía los domingos."),
    ("it+m3", "La biblioteca comunale resterà chiusa per lavori fino alla fine del mese."),
    ("pt", "O médico disse que ele precisa descansar por pelo menos mais uma semana."),
    ("ru", "Завтра будет холодно, поэтому возьмите с собой тёплую куртку и шарф."),
    ("cmn", "今天下午我们在图书馆讨论了新项目的计划。"),
    ("en+f2", "Three hundred and twelve people signed the petition in a single afternoon."),
]
NOISES = ("silence", "hiss", "white", "pink", "brown", "chords", "beat")


def espeak(voice: str, text: str, speed: int = 160) -> np.ndarray:
    """A sentence spoken by espeak-ng, at 16 kHz."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text], check=True)
        data, rate = sf.read(path, dtype="float32")
    return soxr.resample(data, rate, RATE).astype(np.float32)


def trimmed(speech: np.ndarray) -> np.ndarray:
    """From the first to the last audible sample."""
    loud = np.flatnonzero(np.abs(speech) > 1e-3 * np.abs(speech).max())
    return speech[loud[0] : loud[-1] + 1]


def non_speech(kind: str, n: int, rng: np.random.Generator, level: float = 0.1) -> np.ndarray:
    """n samples of a kind of NOISES; level: the RMS of white, pink and brown noise."""
    t = np.arange(n) / RATE
    if kind == "silence":
        x = np.zeros(n)
    elif kind == "hiss":
        x = 0.003 * rng.standard_normal(n)
    elif kind == "white":
        x = level * rng.standard_normal(n)
    elif kind in ("pink", "brown"):
        spectrum = np.fft.rfft(rng.standard_normal(n))
        f = np.maximum(np.fft.rfftfreq(n, 1 / RATE), 20.0)
        x = np.fft.irfft(spectrum / (np.sqrt(f) if kind == "pink" else f), n)
        x *= level / x.std()
    elif kind == "chords":  # sustained triads with harmonics, changing every second, slight vibrato
        x = np.zeros(n)
        roots = [220.0, 196.0, 174.6, 261.6]
        for i, root in enumerate(roots * (n // (4 * RATE) + 1)):
            part = slice(i * RATE, min(n, (i + 1) * RATE))
            if part.start >= n:
                break
            tt = t[part]
            for ratio in (1.0, 1.26, 1.5):
                f0 = root * ratio * (1 + 0.004 * np.sin(2 * np.pi * 5 * tt))
                x[part] += sum(0.05 / k * np.sin(2 * np.pi * k * f0 * tt) for k in range(1, 5))
    elif kind == "beat":  # a kick and a hi-hat, 120 per minute
        x = np.zeros(n)
        for start in range(0, n, RATE // 2):
            k = np.arange(min(RATE // 8, n - start))
            x[start : start + k.size] += 0.4 * np.sin(2 * np.pi * 60 * k / RATE) * np.exp(-k / 800)
            h = start + RATE // 4
            if h < n:
                m = min(800, n - h)
                x[h : h + m] += 0.05 * rng.standard_normal(m) * np.exp(-np.arange(m) / 150)
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def speech_between(
    gaps: list[tuple[str, float]],
    sentences: list[np.ndarray],
    rng: np.random.Generator,
    level: float = 0.1,
    noisy: tuple[int, ...] = (),
    snr_db: float = 15.0,
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """gaps[0], sentences[0], gaps[1], sentences[1], ...: each gap (kind, seconds) of non_speech at
    `level`; the sentences whose index is in `noisy` over pink noise at snr_db. Returns the audio and
    each sentence's [start, end) in samples."""
    parts, spans, pos = [], [], 0
    for i, (kind, seconds) in enumerate(gaps):
        gap = non_speech(kind, int(seconds * RATE), rng, level)
        parts.append(gap)
        pos += gap.size
        if i < len(sentences):
            x = sentences[i]
            if i in noisy:
                bed = non_speech("pink", x.size, rng)
                x = x + bed * np.sqrt(np.mean(x**2) / np.mean(bed**2) / 10 ** (snr_db / 10))
            spans.append((pos, pos + x.size))
            parts.append(x.astype(np.float32))
            pos += x.size
    return np.concatenate(parts).astype(np.float32), spans
