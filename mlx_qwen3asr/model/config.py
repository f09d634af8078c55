"""Model configuration, read from the checkpoint's config.json.

Field names are the checkpoint's own keys, so config.json maps onto the dataclasses without a table.
The config read here is in the original release's layout, the fields nested under `thinker_config`;
MLX conversions keep that nesting and add a `quantization` block. The transformers-native `-hf` layout
(`audio_config`/`text_config` at the top, renamed fields) is rewritten into it first, by
checkpoints/layouts.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A field of config.json is missing, of the wrong type or out of range; the message names it."""


# Size fields every published config carries (release, -hf and MLX conversions alike), with the range
# accepted. The bounds lie far beyond any released model (the 1.7B: 24 + 28 layers, widths up to 6144,
# 151936 tokens) and keep a corrupted config from building a module tree of absurd size; the layer
# counts and widths are then compared with the weights themselves before any module is built.
AUDIO_SIZES: dict[str, tuple[int, int]] = {
    "num_mel_bins": (1, 1024),
    "d_model": (1, 65536),
    "encoder_layers": (1, 512),
    "encoder_attention_heads": (1, 1024),
    "encoder_ffn_dim": (1, 1 << 20),
    "output_dim": (1, 65536),
    "downsample_hidden_size": (1, 65536),
    "n_window": (1, 1024),
    "n_window_infer": (2, 65536),
}
TEXT_SIZES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 65536),
    "intermediate_size": (1, 1 << 20),
    "num_hidden_layers": (1, 512),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (2, 4096),
}
MAX_CLASSES = 1 << 20


def check_int(value: Any, name: str, low: int, high: int) -> int:
    """`value` if it is an integer in [low, high]; else ConfigError naming the field."""
    if value is None:
        raise ConfigError(f"config.json: {name} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.json: {name} is {value!r}, not an integer")
    if not low <= value <= high:
        raise ConfigError(f"config.json: {name} is {value}; it must be between {low} and {high}")
    return value


def check_positive(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"config.json: {name} is {value!r}, not a positive number")
    return value


def _from_dict(cls, values: dict[str, Any], where: str, sizes: dict[str, tuple[int, int]]):
    if not isinstance(values, dict):
        raise ConfigError(f"config.json: {where} is not a JSON object")
    for name, (low, high) in sizes.items():
        check_int(values.get(name), f"{where}.{name}", low, high)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class AudioConfig:
    num_mel_bins: int = 128
    d_model: int = 896
    encoder_layers: int = 18
    encoder_attention_heads: int = 14
    encoder_ffn_dim: int = 3584
    output_dim: int = 1024
    downsample_hidden_size: int = 480
    max_source_positions: int = 1500
    # n_window is half a conv chunk in mel frames (50 -> 100-frame chunks); n_window_infer is the
    # attention window in mel frames (800 -> 8 chunks -> 104 tokens).
    n_window: int = 50
    n_window_infer: int = 800
    activation_function: str = "gelu"
    scale_embedding: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AudioConfig:
        audio = _from_dict(cls, values, "audio_config", AUDIO_SIZES)
        if audio.d_model % audio.encoder_attention_heads:
            raise ConfigError(
                f"config.json: audio_config.encoder_attention_heads ({audio.encoder_attention_heads}) does "
                f"not divide audio_config.d_model ({audio.d_model})"
            )
        if audio.n_window_infer % audio.chunk_frames:
            raise ConfigError(
                f"config.json: audio_config.n_window_infer ({audio.n_window_infer}) is not a multiple of "
                f"2 x audio_config.n_window ({audio.chunk_frames}): the attention window is whole chunks"
            )
        return audio

    @property
    def chunk_frames(self) -> int:
        return 2 * self.n_window

    @property
    def tokens_per_chunk(self) -> int:
        return conv_output_length(self.chunk_frames)

    @property
    def chunks_per_window(self) -> int:
        return self.n_window_infer // self.chunk_frames

    @property
    def conv_freq_bins(self) -> int:
        return conv_output_length(self.num_mel_bins)

    def audio_tokens(self, frames: int) -> int:
        """Encoder output tokens for a segment of this many mel frames (chunks are encoded apart)."""
        full, rest = divmod(frames, self.chunk_frames)
        return full * self.tokens_per_chunk + (conv_output_length(rest) if rest else 0)


def conv_output_length(n: int) -> int:
    """Length after the three stride-2, kernel-3, padding-1 convolutions."""
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


@dataclass
class TextConfig:
    vocab_size: int = 151936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TextConfig:
        text = _from_dict(cls, values, "text_config", TEXT_SIZES)
        for name in ("rms_norm_eps", "rope_theta"):
            check_positive(getattr(text, name), f"text_config.{name}")
        for name in ("tie_word_embeddings", "attention_bias"):
            if not isinstance(getattr(text, name), bool):
                raise ConfigError(
                    f"config.json: text_config.{name} is {getattr(text, name)!r}, not true or false"
                )
        if text.num_attention_heads % text.num_key_value_heads:
            raise ConfigError(
                f"config.json: text_config.num_key_value_heads ({text.num_key_value_heads}) does not "
                f"divide text_config.num_attention_heads ({text.num_attention_heads})"
            )
        if text.head_dim % 2:
            raise ConfigError(
                f"config.json: text_config.head_dim is {text.head_dim}; rotary embeddings need an even one"
            )
        return text


@dataclass
class ModelConfig:
    audio_config: AudioConfig = field(default_factory=AudioConfig)
    text_config: TextConfig = field(default_factory=TextConfig)
    model_type: str = "qwen3_asr"
    audio_token_id: int = 151676
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670
    # Forced aligner only: size of the timestamp classifier head (80 ms bins).
    classify_num: int | None = None
    timestamp_token_id: int | None = None
    timestamp_segment_time: float | None = None
    support_languages: list[str] | None = None
    quantization: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelConfig:
        """The model a release-layout config.json describes (an -hf one goes through
        checkpoints.layouts.normalize first)."""
        thinker = config.get("thinker_config")
        if not isinstance(thinker, dict):
            raise ConfigError(
                "config.json has no thinker_config: not in the release's layout (an -hf config is "
                "rewritten by checkpoints.layouts.normalize)"
            )
        inner = dict(thinker)
        # The aligner's release keeps these at the top level.
        for key in ("timestamp_token_id", "timestamp_segment_time", "support_languages"):
            if key in config and key not in inner:
                inner[key] = config[key]
        if "audio_config" not in inner or "text_config" not in inner:
            raise ValueError("config.json has no audio_config/text_config: not a Qwen3-ASR checkpoint")
        out = cls(
            audio_config=AudioConfig.from_dict(inner["audio_config"]),
            text_config=TextConfig.from_dict(inner["text_config"]),
            model_type=str(inner.get("model_type", config.get("model_type", "qwen3_asr"))),
            quantization=config.get("quantization") or config.get("quantization_config"),
        )
        for key in (
            "audio_token_id",
            "audio_start_token_id",
            "audio_end_token_id",
            "classify_num",
            "timestamp_token_id",
            "timestamp_segment_time",
            "support_languages",
        ):
            if key in inner:
                setattr(out, key, inner[key])
        out.check()
        return out

    def check(self) -> None:
        """Raise ConfigError naming the first field whose value cannot describe a model."""
        text = self.text_config
        if self.audio_config.output_dim != text.hidden_size:
            raise ConfigError(
                f"config.json: audio_config.output_dim ({self.audio_config.output_dim}) differs from "
                f"text_config.hidden_size ({text.hidden_size}): audio features take the place of token "
                "embeddings"
            )
        for name in ("audio_token_id", "audio_start_token_id", "audio_end_token_id"):
            check_int(getattr(self, name), name, 0, text.vocab_size - 1)
        if self.is_forced_aligner:
            check_int(self.classify_num, "classify_num", 1, MAX_CLASSES)
            if self.timestamp_token_id is not None:
                check_int(self.timestamp_token_id, "timestamp_token_id", 0, text.vocab_size - 1)
            if self.timestamp_segment_time is not None:
                check_positive(self.timestamp_segment_time, "timestamp_segment_time")

    @property
    def is_forced_aligner(self) -> bool:
        return "forced_aligner" in self.model_type

    @property
    def padding_id(self) -> int:
        """The token that fills the padding of a batch of prompts of different lengths: any token but
        the audio placeholder (which would take an audio feature); the padding is masked out or unread."""
        return 0 if self.audio_token_id != 0 else 1

    @property
    def kind(self) -> str:
        """ "aligner" for Qwen3-ForcedAligner, "asr" for a speech recognition model."""
        return "aligner" if self.is_forced_aligner else "asr"
