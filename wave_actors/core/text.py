"""Text tokenizers for the thinker's channels. Torch-free, so the node and the simulator use it.

`load_text_codec(path)` returns the real Nemotron tokenizer when the user has its tokenizer.json,
and otherwise `ByteFallbackCodec`: one token per UTF-8 byte above the 1000 reserved special ids.
The fallback exists only so that random-weight runs have text to show; it is not the model's
tokenizer and its token ids mean nothing to real weights.
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path

from wave_actors.core.contract import TextCodec

VOCAB = 131_072
BOS, EOS = 1, 2
LISTENING, PAD = 11, 12
CALL_START, CALL_END, RESPONSE_END = 20, 21, 22     # <SPECIAL_20>, <SPECIAL_21>, <SPECIAL_22>
N_SPECIAL = 1000                                      # <SPECIAL_0> .. <SPECIAL_999>


class ByteFallbackCodec(TextCodec):
    """Byte-level stand-in tokenizer: id = 1000 + byte. Named so nobody mistakes it for the real one."""
    name = "byte-fallback"
    byte_base = N_SPECIAL

    def encode(self, text: str) -> list[int]:
        return [self.byte_base + b for b in text.encode("utf-8")]

    def decode_bytes(self, ids: list[int]) -> bytes:
        return bytes(i - self.byte_base for i in ids if self.byte_base <= i < self.byte_base + 256)

    def char_pieces(self, vocab: int = VOCAB) -> list[str]:
        """Text of each id, for the talker's character table ('' for specials and unused ids)."""
        return [chr(i - self.byte_base) if self.byte_base <= i < self.byte_base + 128 else ""
                for i in range(vocab)]


class HFTokenizerCodec(TextCodec):
    """The real Nemotron tokenizer, read from the tokenizer.json the user supplies."""
    name = "tokenizer.json"

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer
        self._tok = Tokenizer.from_file(str(path))
        self._special = {i for i in range(N_SPECIAL)}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode_bytes(self, ids: list[int]) -> bytes:
        keep = [i for i in ids if i not in self._special]
        return self._tok.decode(keep, skip_special_tokens=True).encode("utf-8")

    def char_pieces(self, vocab: int = VOCAB) -> list[str]:
        return [self._tok.decode([i]) if i < self._tok.get_vocab_size() else "" for i in range(vocab)]


class UserByteFallbackCodec(TextCodec):
    """Stand-in for the RNNT's SentencePiece tokenizer (1024 pieces): ids 32..126 are printable
    ASCII, everything else decodes to nothing. Only for showing random-weight transcripts."""
    name = "rnnt-byte-fallback"

    def encode(self, text: str) -> list[int]:
        return [b for b in text.encode("ascii", "ignore") if 32 <= b < 127]

    def decode_bytes(self, ids: list[int]) -> bytes:
        return bytes(i for i in ids if 32 <= i < 127)


def load_text_codec(path: str | Path | None = None) -> TextCodec:
    if path is None:
        return ByteFallbackCodec()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist")
    json.loads(path.read_text(encoding="utf-8"))  # a clear error for a file that is not JSON
    return HFTokenizerCodec(path)


class TextStream:
    """Incremental decoder: feed ids as they come, get the text they complete (UTF-8 safe)."""

    def __init__(self, codec: TextCodec):
        self._codec = codec
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: list[int]) -> str:
        return self._utf8.decode(self._codec.decode_bytes(ids))
