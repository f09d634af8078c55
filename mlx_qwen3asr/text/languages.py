"""The languages Qwen3-ASR knows: their canonical names, the codes that name them, and how a name is read."""

from __future__ import annotations

__all__ = [
    "CJK_NO_SPACE_LANGUAGES",
    "LANGUAGE_CODES",
    "SUPPORTED_LANGUAGES",
    "guess_text_language",
    "normalize_language_case",
    "resolve_language",
]

SUPPORTED_LANGUAGES: tuple[str, ...] = (
    "Chinese",
    "English",
    "Cantonese",
    "Arabic",
    "German",
    "French",
    "Spanish",
    "Portuguese",
    "Indonesian",
    "Italian",
    "Korean",
    "Russian",
    "Thai",
    "Vietnamese",
    "Japanese",
    "Turkish",
    "Hindi",
    "Malay",
    "Dutch",
    "Swedish",
    "Danish",
    "Finnish",
    "Polish",
    "Czech",
    "Filipino",
    "Persian",
    "Greek",
    "Romanian",
    "Hungarian",
    "Macedonian",
)

# Codes per language; the first one is shown in error messages.
_CODES: dict[str, tuple[str, ...]] = {
    "Chinese": ("zh", "zho", "chi", "cmn", "mandarin"),
    "English": ("en", "eng"),
    "Cantonese": ("yue", "zh-yue", "zh-hk", "zh-mo"),
    "Arabic": ("ar", "ara"),
    "German": ("de", "deu", "ger"),
    "French": ("fr", "fra", "fre"),
    "Spanish": ("es", "spa"),
    "Portuguese": ("pt", "por"),
    "Indonesian": ("id", "ind"),
    "Italian": ("it", "ita"),
    "Korean": ("ko", "kor"),
    "Russian": ("ru", "rus"),
    "Thai": ("th", "tha"),
    "Vietnamese": ("vi", "vie"),
    "Japanese": ("ja", "jpn"),
    "Turkish": ("tr", "tur"),
    "Hindi": ("hi", "hin"),
    "Malay": ("ms", "msa", "may", "zsm"),
    "Dutch": ("nl", "nld", "dut"),
    "Swedish": ("sv", "swe"),
    "Danish": ("da", "dan"),
    "Finnish": ("fi", "fin"),
    "Polish": ("pl", "pol"),
    "Czech": ("cs", "ces", "cze"),
    "Filipino": ("fil", "tl", "tgl", "tagalog"),
    "Persian": ("fa", "fas", "per", "farsi"),
    "Greek": ("el", "ell", "gre"),
    "Romanian": ("ro", "ron", "rum"),
    "Hungarian": ("hu", "hun"),
    "Macedonian": ("mk", "mkd", "mac"),
}

LANGUAGE_CODES: dict[str, str] = {code: name for name, codes in _CODES.items() for code in codes}
_BY_LOWER_NAME: dict[str, str] = {name.lower(): name for name in SUPPORTED_LANGUAGES}

CJK_NO_SPACE_LANGUAGES: frozenset[str] = frozenset({"Chinese", "Cantonese", "Japanese", "Thai"})


def _unsupported(language: str) -> ValueError:
    listing = ", ".join(f"{name} ({_CODES[name][0]})" for name in SUPPORTED_LANGUAGES)
    return ValueError(f"unsupported language {language!r}: use one of {listing}")


def resolve_language(language: str | None) -> str | None:
    """Canonical language name for a name or ISO 639 code (``"en"``, ``"pt_BR"``, ``"english"``);
    ``None`` for no language."""
    if language is None:
        return None
    text = str(language).strip()
    if not text:
        return None
    key = text.lower().replace("_", "-")
    if key in _BY_LOWER_NAME:
        return _BY_LOWER_NAME[key]
    if key in LANGUAGE_CODES:
        return LANGUAGE_CODES[key]
    # Region/script subtags ("zh-CN", "pt-BR", "zh-Hant-HK"): try the first and last subtag pairs,
    # then the base code.
    parts = key.split("-")
    if len(parts) > 1 and all(p.isalnum() for p in parts):
        for candidate in (f"{parts[0]}-{parts[-1]}", parts[0]):
            if candidate in LANGUAGE_CODES:
                return LANGUAGE_CODES[candidate]
    raise _unsupported(text)


def normalize_language_case(name: str) -> str:
    """A language name with its first letter upper case and the rest lower case ("CHINESE" -> "Chinese")."""
    return name[:1].upper() + name[1:].lower()


def _script(ch: str) -> str | None:
    code = ord(ch)
    if 0x3040 <= code <= 0x30FF or 0x31F0 <= code <= 0x31FF or 0xFF66 <= code <= 0xFF9F:
        return "kana"
    if 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
        return "hangul"
    if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
        return "han"
    return None


def guess_text_language(text: str) -> str:
    """The language a transcript's script points to, for cutting it into words when none is given:
    Japanese if it holds kana, Korean if it holds Hangul, Chinese if it holds Han characters and
    neither, English otherwise (every other language the aligner knows is cut at spaces like it)."""
    scripts = {_script(ch) for ch in text}
    if "kana" in scripts:
        return "Japanese"
    if "hangul" in scripts:
        return "Korean"
    if "han" in scripts:
        return "Chinese"
    return "English"
