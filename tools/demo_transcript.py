"""A made-up interview for the web page's screenshots and browser tests: random weights transcribe noise,
so what the page shows of timed words, speakers, low confidence and CJK text is tested on this instead.

`interview()` gives a Transcription (segments a few seconds long, every word timed, two speakers, one
segment of low confidence, Chinese, Japanese and Korean lines); `interview_audio(path)` writes a WAV as
long as it (a quiet tone that changes with each segment, so that the player has something to play).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

RATE = 16000

LINES = [
    (
        "Speaker 1",
        "en",
        "Welcome back to the show. Today I am talking with a baker who gets up at three every morning.",
    ),
    ("Speaker 2", "en", "Thanks for having me. Three is early, but the dough does not wait for anyone."),
    ("Speaker 1", "en", "What does a normal morning look like in the bakery?"),
    (
        "Speaker 2",
        "en",
        "First the ovens, then the sourdough. It has been rising slowly in the cold all night.",
    ),
    ("Speaker 2", "en", "We shape about four hundred loaves before the shop opens at seven."),
    ("Speaker 1", "en", "Four hundred, by hand?"),
    (
        "Speaker 2",
        "en",
        "By hand. A machine tears the gluten, and you can taste the difference in the crumb.",
    ),
    ("Speaker 1", "en", "You trained in Lyon and later in Kyoto, is that right?"),
    ("Speaker 2", "en", "Yes. In Kyoto the bakers said: パンは生き物です, bread is a living thing."),
    ("Speaker 2", "zh", "我们的面包师傅也常说，好面包需要时间和耐心，不能着急。"),
    ("Speaker 1", "en", "And the Korean bakery you visited last spring?"),
    ("Speaker 2", "ko", "서울에서 배운 것은 반죽을 천천히 발효시키는 방법이었어요."),
    ("Speaker 1", "en", "Mm, the the uh, the rye, the rye you you mentioned"),
    (
        "Speaker 2",
        "en",
        "Rye is harder. It has little gluten, so the acid of the starter holds the loaf together.",
    ),
    ("Speaker 1", "en", "What would you tell someone baking their first loaf at home?"),
    (
        "Speaker 2",
        "en",
        "Weigh everything, keep notes, and do not open the oven in the first twenty minutes.",
    ),
    ("Speaker 1", "en", "And if it comes out flat?"),
    (
        "Speaker 2",
        "en",
        "Then you eat it anyway and bake another one tomorrow. Every loaf teaches you something.",
    ),
    ("Speaker 1", "en", "That sounds like good advice for more than bread."),
    ("Speaker 2", "en", "It is. Patience, warmth, and a little salt."),
    ("Speaker 1", "en", "Thank you so much for coming in this morning."),
    ("Speaker 2", "en", "Thank you. I brought a loaf for the studio, it is still warm."),
]
LANGUAGES = {"en": "English", "zh": "Chinese", "ja": "Japanese", "ko": "Korean"}
LOW = 12  # the mumbled segment: low confidence
GAP = 0.4


def _words(text: str, start: float, end: float) -> list[Word]:
    """The words of a line, spread over [start, end] in proportion to their length; CJK characters
    count one by one, runs of other letters as one word."""
    pieces: list[tuple[int, int]] = []
    k = 0
    while k < len(text):
        ch = text[k]
        if ch.isspace():
            k += 1
            continue
        if ord(ch) >= 0x3000:
            if ch.isalnum():
                pieces.append((k, k + 1))
            k += 1
            continue
        j = k
        while j < len(text) and not text[j].isspace() and ord(text[j]) < 0x3000:
            j += 1
        pieces.append((k, j))
        k = j
    weights = [max(1, b - a) for a, b in pieces]
    total = sum(weights)
    words, t = [], start
    for (a, b), w in zip(pieces, weights):
        length = (end - start) * w / total
        # As the pipeline writes words: the text as written, punctuation attached ("morning.").
        words.append(Word(text[a:b], round(t, 3), round(t + 0.85 * length, 3), a, b))
        t += length
    return words


def interview() -> Transcription:
    segments, t = [], 0.3
    for n, (speaker, code, text) in enumerate(LINES):
        seconds = max(1.6, 0.075 * len(text) if code == "en" else 0.22 * len(text))
        language = LANGUAGES[code]
        segments.append(
            Segment(
                start=round(t, 3),
                end=round(t + seconds, 3),
                text=text,
                language=language,
                timing="aligned",
                words=_words(text, t, t + seconds),
                avg_logprob=-1.6 if n == LOW else -0.12 - 0.01 * (n % 5),
                no_speech_prob=0.01,
                speaker=speaker,
            )
        )
        t += seconds + GAP
    return Transcription(
        text=" ".join(s.text for s in segments),
        language="English",
        segments=segments,
        duration=round(t + 0.5, 3),
        source="interview.wav",
        speakers=["Speaker 1", "Speaker 2"],
    )


def interview_audio(path: str | Path, result: Transcription | None = None) -> Path:
    """A WAV as long as the interview: a soft tone per segment (its pitch by speaker), silence between."""
    result = result or interview()
    audio = np.zeros(int(result.duration * RATE), np.float32)
    for s in result.segments:
        a, b = int(s.start * RATE), int(s.end * RATE)
        f = 180.0 if s.speaker == "Speaker 1" else 240.0
        x = np.arange(b - a) / RATE
        audio[a:b] = 0.1 * np.sin(2 * np.pi * f * x) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * x))
    sf.write(path, audio, RATE, subtype="PCM_16")
    return Path(path)
