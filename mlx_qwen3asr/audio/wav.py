"""WAVE headers read directly: the length a header declares, and recorder files whose data size is 0.

libsndfile reports what a header holds or refuses it; these helpers read the RIFF/RF64/BW64 chunks
themselves so that an implausible sample rate is refused before decoding, a truncated file can be told
from a complete one, and a recording whose writer stopped before filling in the data size is read to
the end of the file.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from mlx_qwen3asr.audio.features import AudioError, sample_rate_problem

# RIFF chunks walked looking for "fmt " and "data" before giving up on a header.
_MAX_WAV_CHUNKS = 1024


class RateRefused(AudioError):
    """A sample rate outside the accepted range (passed on as it is, never retried with ffmpeg)."""


@dataclass
class WavHeader:
    """What a RIFF/RF64/BW64 WAVE header states (libsndfile reports what is present, or refuses)."""

    riff: bytes
    rate: int | None = None  # from the "fmt " chunk
    block_align: int = 0
    data_offset: int | None = None  # where the data chunk's samples begin
    data_size: int | None = None  # what the data chunk's header states


def wav_header(f: BinaryIO) -> WavHeader | None:
    """The WAVE header's fields, walking its chunks up to the data chunk; None for other files."""
    fd = f.fileno()
    head = os.pread(fd, 12, 0)
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RF64", b"BW64") or head[8:12] != b"WAVE":
        return None
    header, pos = WavHeader(head[:4]), 12
    for _ in range(_MAX_WAV_CHUNKS):
        chunk = os.pread(fd, 24, pos)
        if len(chunk) < 8:
            break
        cid, size = chunk[:4], struct.unpack("<I", chunk[4:8])[0]
        if cid == b"fmt " and len(chunk) >= 22:
            header.rate = struct.unpack("<I", chunk[12:16])[0]
            header.block_align = struct.unpack("<H", chunk[20:22])[0]
        elif cid == b"data":
            header.data_offset, header.data_size = pos + 8, size
            break
        pos += 8 + size + (size & 1)
    return header


def declared_frames(header: WavHeader | None) -> int | None:
    """Frames a RIFF/WAVE header declares in its data chunk, when it states a length."""
    if header is None or header.riff != b"RIFF" or header.data_size is None or header.block_align == 0:
        return None
    # 0 and 0xFFFFFFFF are what streaming writers put when they cannot know the length.
    if header.data_size in (0, 0xFFFFFFFF):
        return None
    return header.data_size // header.block_align


def _looks_like_chunk(head: bytes, room: int) -> bool:
    """Whether 8 bytes are a RIFF chunk header (four ASCII characters, a size that fits in `room`)."""
    if len(head) < 8 or not all(0x20 <= c < 0x7F for c in head[:4]) or not head[:1].isalnum():
        return False
    return 8 + struct.unpack("<I", head[4:8])[0] <= room


class _PatchedFile:
    """A read-only view of an open file with a few bytes replaced, for libsndfile's virtual I/O."""

    def __init__(self, f: BinaryIO, offset: int, data: bytes):
        self.fd, self.offset, self.data = f.fileno(), offset, data
        self.size, self.pos = os.fstat(self.fd).st_size, 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else n
        out = bytearray(os.pread(self.fd, n, self.pos))
        lo, hi = max(self.pos, self.offset), min(self.pos + len(out), self.offset + len(self.data))
        if lo < hi:
            out[lo - self.pos : hi - self.pos] = self.data[lo - self.offset : hi - self.offset]
        self.pos += len(out)
        return bytes(out)


def sound_input(path: str, f: BinaryIO) -> tuple[BinaryIO | _PatchedFile, WavHeader | None]:
    """What to hand libsndfile for an open file, and its WAVE header when it has one.

    An implausible sample rate in a WAVE header is an AudioError before anything is decoded (libsndfile
    refuses 0 Hz with an unrelated message, and accepts 1 Hz). A RIFF data chunk stating 0 bytes with
    samples after it, as a recorder that stopped before writing the size leaves it, is read to the end of
    the file: libsndfile is shown the size 0xFFFFFFFF, which it already reads that way (as ffmpeg does
    both). Nothing or another chunk after it is a WAV that really is empty.
    """
    header = wav_header(f)
    if header is None:
        return f, None
    if header.rate is not None and (problem := sample_rate_problem(header.rate)) is not None:
        raise RateRefused(path, problem)
    if header.riff == b"RIFF" and header.data_size == 0 and header.block_align > 0:
        room = os.fstat(f.fileno()).st_size - header.data_offset
        after = os.pread(f.fileno(), 8, header.data_offset)
        if room >= header.block_align and not _looks_like_chunk(after, room):
            return _PatchedFile(f, header.data_offset - 4, struct.pack("<I", 0xFFFFFFFF)), header
    return f, header


__all__ = ["RateRefused", "WavHeader", "declared_frames", "sound_input", "wav_header"]
