from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from official import official_module

from mlx_qwen3asr.audio.cutting import Span, segment_audio, split_on_silence

SR = 16000


def loud_noise(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.5 * rng.uniform(-1, 1, int(seconds * SR))).astype(np.float32)


def assert_tiles(segments: list[Span], total: int, max_seconds: float) -> None:
    assert segments[0].start == 0
    assert segments[-1].end == total
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start
    for s in segments:
        assert s.end > s.start or total == 0
        assert s.end - s.start <= int(max_seconds * SR)


def test_segment_helpers():
    s = Span(8000, 40000)
    assert s.start_seconds == 0.5
    assert s.end_seconds == 2.5
    assert s.duration == 2.0
    assert s.num_samples == 32000
    with pytest.raises(AttributeError):
        s.start = 0  # type: ignore[misc]


def test_short_audio_is_one_segment():
    x = loud_noise(12.0)
    assert split_on_silence(x) == [Span(0, x.size)]
    exact = loud_noise(30.0)
    assert split_on_silence(exact, max_seconds=30.0) == [Span(0, exact.size)]
    assert split_on_silence(np.zeros(0, np.float32)) == [Span(0, 0)]


def test_65_seconds_gives_three_segments():
    x = loud_noise(65.0, seed=1)
    segs = split_on_silence(x, max_seconds=30.0)
    assert len(segs) == 3
    assert_tiles(segs, x.size, 30.0)


@pytest.mark.parametrize(
    ("seconds", "max_seconds", "search_seconds"),
    [
        (65.0, 30.0, 5.0),
        (300.0, 30.0, 5.0),
        (61.0, 20.0, 8.0),
        (9.7, 1.0, 5.0),
        (3.3, 0.25, 5.0),
        (100.0, 30.0, 0.0),
    ],
)
def test_tiling_and_max_length(seconds, max_seconds, search_seconds):
    x = loud_noise(seconds, seed=int(seconds * 10))
    segs = split_on_silence(x, max_seconds=max_seconds, search_seconds=search_seconds)
    assert_tiles(segs, x.size, max_seconds)
    # Search spans at most 2/3 of the limit, so every segment but the last keeps at least a third of it.
    for s in segs[:-1]:
        assert s.end - s.start >= int(max_seconds * SR) - 2 * (int(max_seconds * SR) // 3)


def test_cuts_land_in_silent_gaps():
    x = loud_noise(100.0, seed=2)
    # Search windows: [20, 30] s, then [gap1 + 20, gap1 + 30] s, and so on.
    gaps = [(26.0, 26.4), (50.0, 50.3), (74.0, 74.5)]
    decoys = [(10.0, 11.0), (40.0, 41.0)]  # quiet but outside any search window
    for a, b in gaps + decoys:
        x[int(a * SR) : int(b * SR)] = 0.0
    segs = split_on_silence(x, max_seconds=30.0, search_seconds=5.0)
    assert_tiles(segs, x.size, 30.0)
    cuts = [s.end for s in segs[:-1]]
    assert len(cuts) == len(gaps)
    for cut, (a, b) in zip(cuts, gaps, strict=True):
        assert int(a * SR) <= cut < int(b * SR)
        assert x[cut] == 0.0


def test_cut_is_quietest_sample_of_quietest_window():
    x = loud_noise(40.0, seed=3)
    # A soft 100 ms stretch with one even softer sample inside it.
    lo = int(27.0 * SR)
    x[lo : lo + 1600] *= 0.01
    x[lo + 700] = 0.0
    segs = split_on_silence(x, max_seconds=30.0)
    assert [s.end for s in segs[:-1]] == [lo + 700]


@pytest.fixture(scope="module")
def official_split():
    # The official utils module imports librosa at import time but the splitter never uses it.
    stubbed = "librosa" not in sys.modules
    if stubbed:
        sys.modules["librosa"] = types.ModuleType("librosa")
    try:
        yield official_module("inference.utils").split_audio_into_chunks
    finally:
        if stubbed:
            sys.modules.pop("librosa", None)


def test_matches_official_rule_on_shifted_window(official_split):
    """Our window for a limit M equals the official window for target M - S with expansion S.

    The cut rule is otherwise identical, so our cuts are the official cuts, except that the official
    splitter may add one more cut near the end (its loop stops at M - S instead of M).
    """
    rng = np.random.default_rng(11)
    envelope = np.repeat(rng.uniform(0.05, 1.0, 400), int(0.5 * SR))
    x = (envelope[: 170 * SR] * rng.uniform(-1, 1, 170 * SR)).astype(np.float32)
    ours = [s.end for s in split_on_silence(x, max_seconds=30.0, search_seconds=5.0)[:-1]]
    chunks = official_split(x, SR, max_chunk_sec=25.0, search_expand_sec=5.0, min_window_ms=100.0)
    theirs = list(np.cumsum([c.shape[0] for c, _ in chunks[:-1]]))
    assert len(ours) >= 5
    assert theirs[: len(ours)] == ours
    assert len(theirs) - len(ours) in (0, 1)


def test_twenty_minutes_is_fast():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(20 * 60 * SR).astype(np.float32)
    segs = split_on_silence(x, max_seconds=30.0)
    assert_tiles(segs, x.size, 30.0)
    assert 40 <= len(segs) <= 60


def test_argument_validation():
    x = loud_noise(40.0)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_seconds"):
            split_on_silence(x, max_seconds=bad)
    with pytest.raises(ValueError, match="search_seconds"):
        split_on_silence(x, search_seconds=-1.0)
    with pytest.raises(ValueError, match="window_ms"):
        split_on_silence(x, window_ms=0)
    with pytest.raises(ValueError, match="1-D"):
        split_on_silence(np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="shorter than one sample"):
        split_on_silence(x, max_seconds=1e-6)


def test_segment_audio_pads_short_segments():
    x = loud_noise(10.0, seed=5)
    short = segment_audio(x, Span(100, 2100))
    assert short.shape == (8000,)
    np.testing.assert_array_equal(short[:2000], x[100:2100])
    assert not short[2000:].any()
    long = segment_audio(x, Span(0, 20000))
    np.testing.assert_array_equal(long, x[:20000])
    exact = segment_audio(x, Span(5, 8005))
    np.testing.assert_array_equal(exact, x[5:8005])
    assert segment_audio(x, Span(0, 100), min_seconds=0.0).shape == (100,)
    with pytest.raises(ValueError):
        segment_audio(x, Span(0, x.size + 1))
