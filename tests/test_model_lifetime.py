"""A model handed to transcribe, align or a live session is freed once the caller drops it: nothing the
package keeps (caches, schedulers, finalizers) holds it after the work ends."""

from __future__ import annotations

import gc
import weakref

from reference import test_signal

import mlx_qwen3asr


def dies(load, use) -> bool:
    """Load a model, use it, drop it: whether a weak reference to it dies."""
    model = load()
    use(model)
    ref = weakref.ref(model)
    net = weakref.ref(model.net)
    del model
    gc.collect()
    return ref() is None and net() is None


def test_a_model_is_freed_after_transcribe(checkpoints):
    audio = (test_signal(2.0, seed=1), 16000)

    def use(model):
        assert mlx_qwen3asr.transcribe(model, audio, vad=False).segments
        assert mlx_qwen3asr.transcribe(model, audio, vad=False, language="en", context="names").segments

    assert dies(lambda: mlx_qwen3asr.load(checkpoints("tiny")), use)


def test_a_model_is_freed_after_transcribe_with_word_timing(checkpoints):
    aligner = mlx_qwen3asr.load(checkpoints("aligner-tiny"))
    audio = (test_signal(2.0, seed=2), 16000)

    def use(model):
        list(mlx_qwen3asr.transcribe_stream(model, [audio], aligner=aligner, vad=False))

    assert dies(lambda: mlx_qwen3asr.load(checkpoints("tiny")), use)


def test_an_aligner_is_freed_after_align(checkpoints):
    audio = (test_signal(3.0, seed=3), 16000)

    def use(aligner):
        assert len(mlx_qwen3asr.align(aligner, audio, "one two three")) == 3

    assert dies(lambda: mlx_qwen3asr.load(checkpoints("aligner-tiny")), use)


def test_a_model_is_freed_after_a_live_session(checkpoints):
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    audio = test_signal(6.0, seed=4)

    def use(model):
        live = StreamingTranscriber(model, max_new_tokens=4)
        for at in range(0, audio.size, 32000):
            live.feed(audio[at : at + 32000])
        assert isinstance(live.finish().text, str)

    assert dies(lambda: mlx_qwen3asr.load(checkpoints("tiny")), use)


def test_the_check_sees_a_model_that_is_kept(checkpoints):
    kept = []
    assert not dies(lambda: mlx_qwen3asr.load(checkpoints("tiny")), kept.append)
    assert kept[0].kind == "asr"
