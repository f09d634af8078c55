"""The published checkpoint layouts and how each maps onto this package's module tree.

  release   Qwen/Qwen3-ASR-*, Qwen/Qwen3-ForcedAligner-0.6B: config.json with a nested `thinker_config`,
            weights `thinker.audio_tower.*`, `thinker.model.*`, `thinker.lm_head.*` (the tied ASR head
            stored as a copy of the embedding), OIHW convolutions.
  hf        the transformers-native `-hf` repositories: `audio_config`/`text_config` at the top level,
            weights `model.audio_tower.*`, `model.multi_modal_projector.linear_{1,2}.*` (the release's
            proj1/proj2), `model.language_model.*`, and `score.*` (the aligner's classifier) or
            `lm_head.*` (an untied ASR head).
  mlx       mlx-community / mlx-audio conversions and ours: the release's config (plus a `quantization`
            block), weights already in the module tree's names, OHWI convolutions, no tied head.

The loader and the converter both go through `normalize`: one renaming, one config rewrite.
"""

from __future__ import annotations

import copy
from typing import Any

import mlx.core as mx

from mlx_qwen3asr.text.languages import SUPPORTED_LANGUAGES

# transformers' Qwen3ASR port -> the module tree; the first matching prefix wins.
HF_RENAMES = (
    ("model.language_model.", "model."),
    ("model.audio_tower.", "audio_tower."),
    ("model.multi_modal_projector.linear_1.", "audio_tower.proj1."),
    ("model.multi_modal_projector.linear_2.", "audio_tower.proj2."),
    ("score.", "lm_head."),
)
HF_PREFIXES = ("model.language_model.", "model.audio_tower.", "model.multi_modal_projector.")
# transformers' encoder config accepts these aliases for the release's field names.
AUDIO_ALIASES = {
    "num_attention_heads": "encoder_attention_heads",
    "num_hidden_layers": "encoder_layers",
    "hidden_size": "d_model",
    "intermediate_size": "encoder_ffn_dim",
}
# Fields of the release's thinker_config that the -hf layout keeps at the top level.
THINKER_FIELDS = ("audio_token_id", "audio_start_token_id", "audio_end_token_id", "user_token_id")
# Top-level fields of an -hf config that the release layout does not have.
HF_ONLY_FIELDS = (
    "id2label", "label2id", "num_labels", "eos_token_id", "pad_token_id", "dtype", "initializer_range",
    "token_classification_bias", "tie_word_embeddings", "classify_num",
)  # fmt: skip
ASR_TYPE = "qwen3_asr"
ALIGNER_TYPE = "qwen3_forced_aligner"
# Qwen3-ForcedAligner-0.6B's `support_languages`, in the release's order.
ALIGNER_LANGUAGES = (
    "Chinese", "Cantonese", "English", "German", "Spanish", "French", "Italian", "Portuguese", "Russian",
    "Korean", "Japanese",
)  # fmt: skip
DEFAULT_TIMESTAMP_SEGMENT_MS = 80
RELEASE_ROPE_SCALING = {
    "interleaved": True,
    "mrope_interleaved": True,
    "mrope_section": [24, 20, 20],
    "rope_type": "default",
    "type": "default",
}
# What the release's preprocessor_config.json says; an -hf repository does not ship one, and
# conversions written from it carry this (other MLX tools build their feature extractor from it).
PREPROCESSOR_CONFIG = {
    "chunk_length": 30,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "processor_class": "Qwen3ASRProcessor",
    "return_attention_mask": True,
}


class LayoutError(ValueError):
    """The config or the weights are not a Qwen3-ASR / Qwen3-ForcedAligner checkpoint."""


def weight_layout(keys) -> str:
    """ "release", "hf" or "mlx", from the weight names."""
    keys = list(keys)
    if any(k.startswith("thinker.") for k in keys):
        return "release"
    if any(k.startswith(HF_PREFIXES) for k in keys):
        return "hf"
    return "mlx"


def hf_to_module_names(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Rename transformers-native weights onto the module tree (values untouched, convs still OIHW)."""
    out = {}
    for key, value in weights.items():
        for old, new in HF_RENAMES:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        out[key] = value
    return out


def check_model_type(raw: dict[str, Any]) -> None:
    """Refuse a config of another model family, naming its model_type."""
    if not isinstance(raw, dict):
        raise LayoutError("config.json is not a JSON object")
    thinker = raw.get("thinker_config")
    types = [raw.get("model_type"), thinker.get("model_type") if isinstance(thinker, dict) else None]
    types = [t for t in types if isinstance(t, str)]
    # A config without any model_type is judged by its audio/text sections alone.
    if types and not any(ASR_TYPE in t or ALIGNER_TYPE in t for t in types):
        raise LayoutError(f"not a Qwen3-ASR checkpoint (model_type {raw.get('model_type')!r})")
    sections = thinker if isinstance(thinker, dict) else raw
    if not isinstance(sections.get("audio_config"), dict) or not isinstance(
        sections.get("text_config"), dict
    ):
        raise LayoutError("config.json has no audio_config/text_config: not a Qwen3-ASR checkpoint")


def release_layout_config(raw: dict[str, Any], head_rows: int | None) -> dict[str, Any]:
    """Rewrite a top-level (-hf) config into the release's layout, as the release itself writes it.

    head_rows: rows of the source's classifier (`score`) when it has one: the aligner's class count.
    """
    config = copy.deepcopy(raw)
    audio = dict(config.pop("audio_config"))
    text = dict(config.pop("text_config"))
    for alias, name in AUDIO_ALIASES.items():
        if alias in audio and name not in audio:
            audio[name] = audio.pop(alias)
    rope = text.get("rope_parameters") or {}
    if "rope_theta" not in text and "rope_theta" in rope:
        text["rope_theta"] = rope["rope_theta"]
    # transformers' port runs plain RoPE; the release describes the same as MRoPE with equal positions.
    text.setdefault("rope_scaling", copy.deepcopy(RELEASE_ROPE_SCALING))
    if "tie_word_embeddings" not in text and "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]

    architectures = [str(a) for a in config.get("architectures") or []]
    aligner = (
        ALIGNER_TYPE in str(config.get("model_type", ""))
        or head_rows is not None
        or any("TokenClassification" in a for a in architectures)
        or "classify_num" in config
    )
    thinker: dict[str, Any] = {"model_type": ALIGNER_TYPE if aligner else ASR_TYPE}
    thinker.update(audio_config=audio, text_config=text)
    for key in THINKER_FIELDS:
        if key in config:
            thinker[key] = config.pop(key)
    if "dtype" in config:
        thinker["dtype"] = config["dtype"]
    out: dict[str, Any] = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": ASR_TYPE}
    if aligner:
        classes = config.get("classify_num") or head_rows or config.get("num_labels")
        if classes is None and isinstance(config.get("id2label"), dict):
            classes = len(config["id2label"])
        if not classes:
            raise LayoutError("forced-aligner config without a class count (classify_num / num_labels)")
        thinker["classify_num"] = int(classes)
        out["timestamp_token_id"] = config.get("timestamp_token_id", 151705)
        out["timestamp_segment_time"] = config.get("timestamp_segment_time", DEFAULT_TIMESTAMP_SEGMENT_MS)
        out["support_languages"] = list(config.get("support_languages") or ALIGNER_LANGUAGES)
    else:
        out["support_languages"] = list(config.get("support_languages") or SUPPORTED_LANGUAGES)
    out["thinker_config"] = thinker
    skip = {
        "architectures",
        "model_type",
        "timestamp_token_id",
        "timestamp_segment_time",
        "support_languages",
    }
    for key, value in config.items():
        if key not in skip and key not in HF_ONLY_FIELDS and key not in out:
            out[key] = value
    return out


def normalize(
    raw: dict[str, Any], weights: dict[str, mx.array]
) -> tuple[str, dict[str, Any], dict[str, mx.array]]:
    """(layout, release-layout config, weights in the module tree's names) of any published layout.

    Convolutions keep their stored orientation here; the model's `sanitize` settles them.
    """
    check_model_type(raw)
    layout = weight_layout(weights)
    # transformers names the aligner's classifier `score`; its rows are the class count.
    head_rows = int(weights["score.weight"].shape[0]) if "score.weight" in weights else None
    if layout == "hf":
        weights = hf_to_module_names(weights)
    if "thinker_config" in raw:
        return layout, copy.deepcopy(raw), weights
    config = release_layout_config(raw, head_rows)
    return ("hf" if layout == "release" else layout), config, weights
