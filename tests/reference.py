"""The official implementation run on a checkpoint, stage by stage, as the parity tests' reference.

Windowing: the official transformers backend builds `cu_seqlens` for the encoder's 104-token attention
windows but, under sdpa/eager, calls every encoder layer without a mask, so each token attends to the
whole segment (QwenLM/Qwen3-ASR issue 213). The model was trained windowed and vLLM/FlashAttention run
it windowed. `windowed=True` makes the reference windowed by handing each encoder attention call the
block-diagonal mask that the official `Qwen3ASRAudioEncoder._prepare_attention_mask` builds from those
same `cu_seqlens`: every token attends exactly to the tokens of its own window, as FlashAttention's
varlen path computes.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path

import cached
import golden
import numpy as np
import torch
from official import official_module
from signals import test_signal  # noqa: F401 (the tests take it from here too)

HERE = Path(__file__).resolve().parent

# MLX's CPU backend runs on OpenBLAS loaded globally (mlx_qwen3asr.runtime.cpu); with it in the process,
# torch's OpenMP threads and OpenBLAS's threads oversubscribe the cores and the reference runs ~3x
# slower than on one torch thread (20 s of audio, 32 greedy steps, 2 cores: 32.6 s vs 12.4 s).
torch.set_num_threads(1)


@dataclass
class ReferenceRun:
    input_ids: list[int]
    mel: np.ndarray  # (n_mels, frames)
    encoder: np.ndarray  # (tokens, output_dim)
    prefill_logits: np.ndarray  # (vocab,) at the last prompt position: what picks the first token
    step_logits: np.ndarray  # (steps, vocab): the logits of every greedy step
    greedy_ids: list[int]


def _backend():
    """The official transformers backend, its config and processor registered with transformers."""
    backend = official_module("core.transformers_backend")
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_asr", backend.Qwen3ASRConfig, exist_ok=True)
    AutoProcessor.register(backend.Qwen3ASRConfig, backend.Qwen3ASRProcessor, exist_ok=True)
    return backend


def _official_model(checkpoint: Path, what: str):
    """The official model loaded from a checkpoint in float32, in eval mode."""
    backend = _backend()
    torch.manual_seed(0)
    model, info = backend.Qwen3ASRForConditionalGeneration.from_pretrained(
        str(checkpoint), dtype=torch.float32, output_loading_info=True
    )
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise RuntimeError(f"the official {what} did not load {checkpoint} cleanly: {info}")
    return model.eval()


def _processor(checkpoint: Path, fix_mistral_regex: bool = True):
    _backend()
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(checkpoint), fix_mistral_regex=fix_mistral_regex)


class _Cached:
    """The official model for one checkpoint, loaded only when a result is neither in the committed
    golden data of a real-shape preset (tests/golden.py; `preset` names the checkpoint's) nor on disk
    already (tests/cached.py: keyed by the checkpoint, this file's and official.py's source, the
    reference's library versions and the inputs)."""

    def __init__(self, checkpoint: str | Path, preset: str | None = None):
        self.checkpoint = Path(checkpoint)
        self.modeling = official_module("core.transformers_backend.modeling_qwen3_asr")
        self.golden = golden.Store(preset, self.checkpoint) if preset in golden.PRESETS else None

    @functools.cached_property
    def _key(self) -> str:
        return cached.key_of(
            cached.identity(self.checkpoint),
            HERE / "reference.py",
            HERE / "official.py",
            cached.versions("torch", "transformers", "qwen-asr", "numpy"),
        )

    def _kept(self, what: str, compute, *inputs) -> dict[str, np.ndarray]:
        return cached.arrays(
            "official", f"{type(self).__name__}-{what}", cached.key_of(self._key, what, *inputs), compute
        )


class OfficialReference(_Cached):
    """The official model and processor for one checkpoint directory, in float32."""

    @functools.cached_property
    def model(self):
        return _official_model(self.checkpoint, "model")

    @functools.cached_property
    def processor(self):
        return _processor(self.checkpoint)  # as the official Qwen3ASRModel.from_pretrained loads it

    def prompt_text(self, context: str = "", language: str | None = None) -> str:
        """The prompt string exactly as the official `Qwen3ASRModel._build_text_prompt` renders it."""
        messages = [
            {"role": "system", "content": context or ""},
            {"role": "user", "content": [{"type": "audio", "audio": ""}]},
        ]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text + f"language {language}<asr_text>" if language else text

    def inputs(self, wav: np.ndarray, context: str = "", language: str | None = None):
        return self.processor(
            text=[self.prompt_text(context, language)], audio=[wav], return_tensors="pt", padding=True
        )

    @staticmethod
    def features(inputs) -> tuple[list[int], np.ndarray]:
        """(prompt ids, mel features of the audio's frames) of the processor's output."""
        frames = int(inputs["feature_attention_mask"].sum())
        return inputs["input_ids"][0].tolist(), inputs["input_features"][0, :, :frames].numpy()

    @contextlib.contextmanager
    def windowed(self, enabled: bool = True):
        """Give the encoder's attention the official block-diagonal window mask while active."""
        attention = self.modeling.Qwen3ASRAudioAttention
        original = attention.forward
        encoder = self.model.thinker.audio_tower

        def forward(module, hidden_states, cu_seqlens=None, attention_mask=None, **kwargs):
            if attention_mask is None:
                attention_mask = encoder._prepare_attention_mask(hidden_states, cu_seqlens)
            return original(
                module, hidden_states, cu_seqlens=cu_seqlens, attention_mask=attention_mask, **kwargs
            )

        if enabled:
            attention.forward = forward
        try:
            yield
        finally:
            attention.forward = original

    def encode(self, mel: np.ndarray, windowed: bool = True) -> np.ndarray:
        served = self.golden.encode(mel, windowed) if self.golden else None
        if served is not None:
            return served
        return self._kept("encode", lambda: {"out": self._encode(mel, windowed)}, mel, windowed)["out"]

    @torch.no_grad()
    def _encode(self, mel: np.ndarray, windowed: bool) -> np.ndarray:
        with self.windowed(windowed):
            out = self.model.thinker.audio_tower(
                torch.from_numpy(mel), feature_lens=torch.tensor([mel.shape[1]])
            ).last_hidden_state
        return out.numpy()

    def run(
        self, wav: np.ndarray, context: str = "", language: str | None = None, steps: int = 32
    ) -> ReferenceRun:
        """One official greedy `generate` call; the encoder output is captured on the way."""
        served = self.golden.run(self, wav, context, language, steps) if self.golden else None
        if served is not None:
            return served
        kept = self._kept(
            "run", lambda: vars(self._run(wav, context, language, steps)), wav, context, language, steps
        )
        return ReferenceRun(
            input_ids=kept["input_ids"].tolist(),
            mel=kept["mel"],
            encoder=kept["encoder"],
            prefill_logits=kept["prefill_logits"],
            step_logits=kept["step_logits"],
            greedy_ids=kept["greedy_ids"].tolist(),
        )

    @torch.no_grad()
    def _run(self, wav: np.ndarray, context: str, language: str | None, steps: int) -> ReferenceRun:
        inputs = self.inputs(wav, context, language)
        captured = []
        hook = self.model.thinker.audio_tower.register_forward_hook(
            lambda module, args, output: captured.append(output.last_hidden_state.numpy().copy())
        )
        try:
            with self.windowed():
                out = self.model.generate(
                    **inputs,
                    max_new_tokens=steps,
                    do_sample=False,
                    pad_token_id=151643,
                    output_logits=True,
                )
        finally:
            hook.remove()
        prompt_len = inputs["input_ids"].shape[1]
        logits = torch.cat(list(out.logits), dim=0).float().numpy()
        ids, mel = self.features(inputs)
        return ReferenceRun(
            input_ids=ids,
            mel=mel,
            encoder=captured[0],
            prefill_logits=logits[0],
            step_logits=logits,
            greedy_ids=out.sequences[0, prompt_len:].tolist(),
        )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


class OfficialAligner(_Cached):
    """The official forced aligner on a checkpoint directory, in float32, with the encoder windowed.

    Runs what `qwen_asr.inference.qwen3_forced_aligner.Qwen3ForcedAligner.align` runs for one sample
    (processor, one thinker forward, argmax at the <timestamp> positions), on a word list given.
    """

    TIMESTAMP = 151705

    @functools.cached_property
    def model(self):
        return _official_model(self.checkpoint, "aligner")

    @functools.cached_property
    def processor(self):
        return _processor(self.checkpoint)  # as the official loader builds it

    @functools.cached_property
    def qwen_split_processor(self):
        # With the model's own (Qwen) split, which differs from the official loader's on mixed-case
        # words (see the README's tokenizer section).
        return _processor(self.checkpoint, fix_mistral_regex=False)

    windowed = OfficialReference.windowed

    def run(
        self, wav: np.ndarray, words: list[str], qwen_split: bool = False
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """(input ids, class at every timestamp position, logits there) for one sample."""
        served = self.golden.align(self, wav, words, qwen_split) if self.golden else None
        if served is not None:
            return served

        def compute() -> dict[str, np.ndarray]:
            ids, classes, logits = self._run(wav, words, qwen_split)
            return {"ids": np.array(ids, dtype=np.int64), "classes": classes, "logits": logits}

        kept = self._kept("run", compute, wav, list(words), qwen_split)
        return kept["ids"].tolist(), kept["classes"], kept["logits"]

    def inputs(self, wav: np.ndarray, words: list[str], qwen_split: bool = False):
        text = "<|audio_start|><|audio_pad|><|audio_end|>" + "<timestamp><timestamp>".join(words)
        text += "<timestamp><timestamp>"
        processor = self.qwen_split_processor if qwen_split else self.processor
        return processor(text=[text], audio=[wav], return_tensors="pt", padding=True)

    @torch.no_grad()
    def _run(
        self, wav: np.ndarray, words: list[str], qwen_split: bool
    ) -> tuple[list[int], np.ndarray, np.ndarray]:
        inputs = self.inputs(wav, words, qwen_split)
        with self.windowed():
            logits = self.model.thinker(**inputs).logits[0]
        ids = inputs["input_ids"][0]
        at = ids == self.TIMESTAMP
        return ids.tolist(), logits.argmax(-1)[at].numpy(), logits[at].numpy()
