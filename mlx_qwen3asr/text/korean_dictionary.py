"""The official Korean dictionary that scores soynlp's word cut, shipped with this package.

The official package scores its Korean word cut with qwen_asr/inference/assets/korean_dict_jieba.dict.
That file (Apache-2.0, see data/NOTICE.korean_dict_jieba and data/LICENSE.korean_dict_jieba) ships
unchanged in mlx_qwen3asr/text/data/ and is read from there: nothing is fetched, and an installed copy
of the official package is not looked for, so every installation cuts Korean the same way.
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = [
    "KOREAN_DICT_NAME",
    "KOREAN_DICT_SHA256",
    "KoreanDictionaryError",
    "korean_dictionary_bytes",
]

KOREAN_DICT_NAME = "korean_dict_jieba.dict"
# sha256 of qwen_asr/inference/assets/korean_dict_jieba.dict in qwen-asr 0.0.6 (275,834 bytes).
KOREAN_DICT_SHA256 = "cc157a9ab78f92bf11ed98a69b285768d6627cf5cd57a581e6c06693effce37d"


class KoreanDictionaryError(RuntimeError):
    """The shipped Korean dictionary is missing or damaged (a broken installation)."""


def korean_dictionary_bytes() -> bytes:
    """The shipped dictionary's bytes, checked against KOREAN_DICT_SHA256.

    Raises KoreanDictionaryError saying what is wrong with the installed file.
    """
    resource = resources.files("mlx_qwen3asr.text") / "data" / KOREAN_DICT_NAME
    try:
        data = resource.read_bytes()
    except OSError as error:
        raise KoreanDictionaryError(
            f"data/{KOREAN_DICT_NAME} of mlx_qwen3asr.text cannot be read ({error}); reinstall mlx-qwen3asr"
        ) from error
    digest = hashlib.sha256(data).hexdigest()
    if digest != KOREAN_DICT_SHA256:
        raise KoreanDictionaryError(
            f"data/{KOREAN_DICT_NAME} of mlx_qwen3asr.text has sha256 {digest}, expected "
            f"{KOREAN_DICT_SHA256}; reinstall mlx-qwen3asr"
        )
    return data
