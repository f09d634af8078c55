"""Access to the official qwen-asr implementation, the numerical reference of the parity tests.

`import qwen_asr` runs the package's __init__, which imports the inference wrapper and with it
librosa and nagisa (demo and aligner dependencies that the reference computation never uses). The
transformers backend itself needs only torch, numpy and transformers, so the package is registered
here without running its __init__, and the backend modules are imported from it directly.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def official_module(name: str) -> types.ModuleType:
    """Import `qwen_asr.<name>` without executing qwen_asr/__init__.py."""
    if "qwen_asr" not in sys.modules:
        spec = importlib.util.find_spec("qwen_asr")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(
                "the official qwen-asr package is not installed (pip install --no-deps qwen-asr)"
            )
        package = types.ModuleType("qwen_asr")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["qwen_asr"] = package
    return importlib.import_module(f"qwen_asr.{name}")


def _with_stand_ins(name: str, stand_ins: dict[str, types.ModuleType]) -> types.ModuleType:
    """official_module(name), imported with these modules standing in for missing ones (taken out of
    sys.modules again afterwards)."""
    saved = {key: sys.modules.get(key) for key in stand_ins}
    sys.modules.update(stand_ins)
    try:
        return official_module(name)
    finally:
        for key, module in saved.items():
            if module is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = module


def official_aligner_module() -> types.ModuleType:
    """The official aligner module. Its audio helpers import librosa, and the module imports nagisa at
    the top; only its text and timestamp processing is used here, so a missing librosa or nagisa is
    stood in for while it is imported (and taken out of sys.modules again afterwards)."""
    name = "inference.qwen3_forced_aligner"
    stand_ins: dict[str, types.ModuleType] = {}
    if importlib.util.find_spec("nagisa") is None:
        stand_ins["nagisa"] = types.ModuleType("nagisa")
    if importlib.util.find_spec("librosa") is None:
        utils = types.ModuleType("qwen_asr.inference.utils")
        utils.AudioLike = object
        utils.ensure_list = utils.normalize_audios = None
        stand_ins["qwen_asr.inference.utils"] = utils
    return _with_stand_ins(name, stand_ins)


def official_inference_module() -> types.ModuleType:
    """The official inference wrapper module (`qwen_asr.inference.qwen3_asr`: Qwen3ASRModel with its
    streaming methods, ASRStreamingState). Its utils module imports librosa at the top for reading
    files, which the streaming methods never use; a missing librosa (or nagisa, imported by the
    aligner module it imports) is stood in for while it is imported."""
    name = "inference.qwen3_asr"
    # Imported first, without stand-ins: transformers looks for librosa with find_spec as it loads.
    official_module("core.transformers_backend")
    importlib.import_module("transformers").AutoModel  # noqa: B018 (loads the lazy auto classes)
    stand_ins: dict[str, types.ModuleType] = {}
    for missing in ("librosa", "nagisa"):
        if importlib.util.find_spec(missing) is None:
            stand_ins[missing] = types.ModuleType(missing)
    return _with_stand_ins(name, stand_ins)
