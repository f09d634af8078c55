"""One decode of a live window, with the work kept between steps: the encoder's blocks and their
prompt keys and values, the conv stems of complete chunks, and the draft.

The encoder attends within 8 s windows ("blocks") and its conv stem within 1 s chunks, so the features
of complete blocks, and the prompt's keys and values through their audio tokens, are kept while the
block's log-mel frames stay the same (see :class:`Blocks`); a step encodes and prefills only the audio
after them, the text after it and the tail of the prompt. Decoding first checks a draft, the tokens
the last output had after the prefix (those the rollback took back), in the same pass as the prompt,
and keeps them as far as greedy decoding would have picked them (``model.draft``): the tokens are the
same, each right one saves a decoding step.

A decode is prepared (encoded and prefilled: ``WindowDecoder.prepare``, a ``DraftStart``) and then
decoded on: here, in a batch of its own (``WindowDecoder.decode``), or as a row of the server's
running batch beside file requests (``Engine.submit_step(..., prepare=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio.features import HOP_LENGTH, log_mel_spectrogram
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.draft import DraftStart, decode_alone, prefill_draft
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.model.generate import Generation, HeaderIds, Prefix, extend_prefix, prefill_prefix
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.runtime.device import tuning

# Prompt starts (keys and values through a kept encoder window) kept per window: the last ones.
KEPT_PREFIXES = 3

# Log-mel frames (normalized, (log10 + 4) / 4) this close count as the same frames when encoder
# windows are kept: computed again over a longer clip a frame can round differently in its last bits,
# and a louder sound later lifts the floor (8 log10 units under the loudest frame) under the quietest
# bins of earlier frames. A window is encoded again when one of its bins moved by more: 0.01 is 0.4 dB.
SAME_FRAME_TOLERANCE = 0.01


def _same_frames(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.max(np.abs(a - b), initial=0.0) <= SAME_FRAME_TOLERANCE)


@dataclass
class Blocks:
    """Encoder output of a window's complete encoder attention windows ("blocks"), and the decoder's
    keys and values of the prompt up to the end of each, for the next decode of audio that starts the
    same way.

    A block's features depend only on its own mel frames (the encoder's chunks and attention windows
    end at block boundaries), so they hold for any audio whose log-mel frames there are the same. The
    frames are compared rather than the samples: a louder sound later in the window raises the
    clip's maximum and with it the floor 8 below it, which changes the quietest bins of earlier
    frames; the blocks from the first one with a bin moved by more than SAME_FRAME_TOLERANCE (0.4 dB)
    on are then encoded again, as the official step encodes everything every time. A kept block is
    thus the official one up to float rounding and such sub-0.4 dB floor moves.
    """

    mel: np.ndarray  # the log-mel frames the blocks were computed from (n_mels, >= blocks x frames)
    features: list[mx.array | None]  # per block, (tokens_per_block, dim) (None: dropped with its prefix)
    prefixes: list[Prefix | None]  # prefixes[k]: the prompt through block k's audio (None: dropped)


class WindowDecoder:
    """The decodes of one live stream's windows, keeping what the next one can use.

    start_ids: the prompt start (system prompt and context). reuse_blocks: keep the blocks and stems
    (False encodes every window whole, as the official step does). encoded_samples counts the samples
    passed to the encoder.
    """

    def __init__(self, model: ASRModel, start_ids: list[int], header: HeaderIds, reuse_blocks: bool = True):
        self.model, self.start_ids, self.header = model, list(start_ids), header
        self.reuse_blocks = bool(reuse_blocks)
        self.start: Prefix | None = None
        self.blocks: Blocks | None = None
        self.stems: dict[int, tuple[np.ndarray, mx.array]] = {}  # first frame -> (frames, conv stem)
        self.encoded_samples = 0

    def decode(
        self,
        audio: np.ndarray,
        suffix: Callable[[int], list[int]],
        budget: int,
        draft: Sequence[int],
        eos: frozenset[int],
    ) -> Generation:
        """Encode the window and decode its prompt greedily, on this thread."""
        start, prefix = self.prepare(audio, suffix, budget, draft, eos)
        return decode_alone(self.model.net, start, eos, prefix, self.header)

    def prepare(
        self,
        audio: np.ndarray,
        suffix: Callable[[int], list[int]],
        budget: int,
        draft: Sequence[int],
        eos: frozenset[int],
    ) -> tuple[DraftStart, Prefix]:
        """Encode the window (only the audio after the kept blocks) and prefill its prompt, given by
        suffix(n_audio_tokens) after the prompt start, and the draft after the keys and values kept
        through the last kept block: (the row, ready to decode on; the prompt start it was prefilled
        after, which begins with the start ids)."""
        net = self.model.net
        if self.start is None:
            self.start = prefill_prefix(net, self.start_ids)
        mel = log_mel_spectrogram(audio)
        cfg = self.model.config.audio_config
        block = cfg.chunk_frames * cfg.chunks_per_window
        # A block is complete when a frame follows it: its last frame's samples are all there.
        complete = max(0, (mel.shape[1] - 1) // block) if self.reuse_blocks else 0
        known = self._blocks_for(mel, complete, block)
        start_frame = len(known.features) * block if known is not None else 0
        self.encoded_samples += max(0, audio.shape[0] - start_frame * HOP_LENGTH)
        new = (
            self._encode_tail(mel, start_frame)
            if self.reuse_blocks
            else encode_segments(self.model, [mel])[0]
        )
        tokens_per_block = cfg.tokens_per_chunk * cfg.chunks_per_window
        have = [] if known is None else known.features
        n_audio = len(have) * tokens_per_block + int(new.shape[0])
        rest = suffix(n_audio)
        audio_id = net.config.audio_token_id
        head = rest.index(audio_id) if n_audio else len(rest)
        draft = list(draft)
        if not complete:
            return prefill_draft(net, rest, new, budget, eos, self.start, draft, self.header), self.start
        blocks = known or Blocks(mel, [], [])
        blocks.mel = mel
        prefix = blocks.prefixes[-1] if blocks.prefixes else None
        for k in range(len(blocks.features), complete):
            features = new[(k - len(have)) * tokens_per_block : (k - len(have) + 1) * tokens_per_block]
            ids = [audio_id] * tokens_per_block
            if prefix is None:
                prefix, ids = self.start, rest[:head] + ids
            blocks.features.append(features)
            blocks.prefixes.append(extend_prefix(net, prefix, ids, features))
            prefix = blocks.prefixes[-1]
        # Only the last KEPT_PREFIXES prompt starts are kept (a commit's head needs one a block or
        # two shorter): each holds the keys and values of everything before it.
        for k in range(len(blocks.prefixes) - KEPT_PREFIXES):
            blocks.prefixes[k] = blocks.features[k] = None
        self.blocks = blocks
        taken = complete * tokens_per_block
        tail = new[taken - len(have) * tokens_per_block :]
        return prefill_draft(net, rest[head + taken :], tail, budget, eos, prefix, draft, self.header), prefix

    def _encode_tail(self, mel: np.ndarray, start_frame: int) -> mx.array:
        """Encoder features of the frames from `start_frame` (a block boundary) on. The conv stem works
        on each 100-frame chunk alone: the stems of complete chunks (a frame follows them) whose frames
        are those of the last call are taken from it."""
        cfg = self.model.config.audio_config
        tower = self.model.net.audio_tower
        tail = mel[:, start_frame:]
        batch = encoder_batch([tail], cfg, self.model.dtype)
        cf = cfg.chunk_frames
        old = self.stems
        stems, fresh = [], []
        for i in range(batch.chunks.shape[0]):
            first = start_frame + i * cf
            frames = mel[:, first : first + cf]
            hit = old.get(first)
            if hit is not None and frames.shape[1] == cf and _same_frames(hit[0], frames):
                stems.append(hit[1])
            else:
                stems.append(None)
                fresh.append(i)
        if fresh:
            step = tuning().stem_chunks
            for k in range(0, len(fresh), step):
                idx = fresh[k : k + step]
                out = tower.embed_chunks(batch.chunks[mx.array(idx, dtype=mx.int32)])
                mx.eval(out)
                for j, i in enumerate(idx):
                    stems[i] = out[j : j + 1]
        keep = {}
        for i, stem in enumerate(stems):
            first = start_frame + i * cf
            if first + cf < mel.shape[1]:  # complete: a frame follows
                keep[first] = (mel[:, first : first + cf].copy(), stem)
        self.stems = keep
        features = tower.encode_embedded(mx.concatenate(stems, axis=0), batch)
        mx.eval(features)
        return features

    def _blocks_for(self, mel: np.ndarray, complete: int, block: int) -> Blocks | None:
        """The cached blocks that hold for these frames (at most `complete`, up to the first whose
        frames changed), or None."""
        known = self.blocks
        if known is None or not complete:
            return None
        k = 0
        while k < min(len(known.features), complete):
            frames = slice(k * block, (k + 1) * block)
            if not _same_frames(known.mel[:, frames], mel[:, frames]):
                break
            k += 1
        while k > 0 and known.prefixes[k - 1] is None:
            k -= 1
        if k == 0:
            return None
        return Blocks(known.mel, known.features[:k], known.prefixes[:k])


__all__ = ["KEPT_PREFIXES", "SAME_FRAME_TOLERANCE", "Blocks", "WindowDecoder"]
