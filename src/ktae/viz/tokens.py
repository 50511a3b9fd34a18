"""The text of each token of a response, as its tokenizer decodes it.

Decoding one token at a time breaks for byte-level BPE (GPT-2, Qwen, Llama 3): a
multi-byte character such as ``"é"`` or an emoji may be split over two tokens, each of
which decodes alone to ``"\\ufffd"``, and merged tokens carry a leading-space marker.
:func:`token_pieces` instead assigns every character of the decoded response to exactly
one token, so that the pieces concatenate to the decoded text:

* byte-level tokenizers (their decoder is ``ByteLevel``): each token's bytes come from
  the GPT-2 byte alphabet; a character belongs to the token holding its last byte, and a
  token that holds only the first bytes of a character gets the empty text and keeps its
  ``raw`` bytes (shown in hex);
* any other tokenizer: incremental decoding over a short window, as streaming
  detokenisers do: a token gets the text its decoding adds, or the empty text while
  that text would end in an incomplete character.

Special tokens (``<eos>``, ``<|endoftext|>``) keep their own text. Each piece also says
which earlier tokens hold the first bytes of its first character (``lead``), so that a
renderer can draw a split character once, over all its tokens
(:mod:`ktae.viz.text_layout`).
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from functools import lru_cache

REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class TokenPiece:
    """One token's share of the decoded text.

    ``text``: the characters this token completes (``""`` when it completes none);
    ``raw``: the token's bytes for byte-level tokenizers (None for other tokenizers and
    special tokens); ``lead``: how many tokens just before this one hold the first bytes
    of its first character (0 when the character starts in this token);
    ``special``: a special token (``<eos>``, ``<|im_end|>``).
    """

    text: str
    raw: bytes | None = None
    lead: int = 0
    special: bool = False


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte alphabet, reversed: printable stand-in character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def is_byte_level(tokenizer) -> bool:
    """True when the tokenizer's decoder is (or contains) ``ByteLevel``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    try:  # the decoder alone: serialising the whole tokenizer takes a second on a real one
        decoder = json.loads(backend.decoder.__getstate__()) if backend.decoder else {}
    except (AttributeError, TypeError, ValueError):
        return False
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any(isinstance(p, dict) and p.get("type") == "ByteLevel" for p in parts)


def _added_ids(tokenizer) -> dict[int, bool]:
    """Added tokens: id -> whether it is a special token."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i): bool(getattr(t, "special", True)) for i, t in added.items()}


def _check_ids(tokenizer, ids: list[int]) -> None:
    n = len(tokenizer)
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise ValueError(f"token_ids: id {bad[0]} is outside the tokenizer's vocabulary of {n} "
                         "tokens (was the response made with another tokenizer?)")


def token_pieces(tokenizer, ids) -> list[TokenPiece]:
    """One :class:`TokenPiece` per id; their texts concatenate to the decoded response.

    Args:
        tokenizer: a ``transformers`` tokenizer (``decode``, ``convert_ids_to_tokens``).
        ids: the response's token ids (ints).

    Raises:
        ValueError: an id outside the tokenizer's vocabulary.
    """
    ids = [int(i) for i in ids]
    _check_ids(tokenizer, ids)
    if is_byte_level(tokenizer):
        return _byte_level_pieces(tokenizer, ids)
    return _incremental_pieces(tokenizer, ids)


def _byte_level_pieces(tokenizer, ids: list[int]) -> list[TokenPiece]:
    table = _byte_decoder()
    added = _added_ids(tokenizer)
    strings = tokenizer.convert_ids_to_tokens(ids)
    texts = [""] * len(ids)
    leads = [0] * len(ids)
    raws: list[bytes | None] = [None] * len(ids)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    last = None  # the token holding the latest byte fed to the decoder
    start = 0  # the token holding the first byte of the character being decoded

    def emit(k: int, text: str) -> None:
        if text and not texts[k]:
            leads[k] = k - start
        texts[k] += text

    def flush():
        if last is not None:
            emit(last, decoder.decode(b"", final=True))
        decoder.reset()

    for k, (tid, s) in enumerate(zip(ids, strings, strict=True)):
        if tid in added or s is None or any(ch not in table for ch in s):
            flush()
            texts[k] = tokenizer.decode([tid], skip_special_tokens=False)
            last = None
            continue
        raws[k] = bytes(table[ch] for ch in s)
        for byte in raws[k]:
            if not decoder.getstate()[0]:  # no pending bytes: a new character starts
                start = k
            emit(k, decoder.decode(bytes([byte])))
        last = k
    flush()
    return [TokenPiece(t, r, lead, added.get(tid, False))
            for t, r, lead, tid in zip(texts, raws, leads, ids, strict=True)]


def _incremental_pieces(tokenizer, ids: list[int]) -> list[TokenPiece]:
    def decode(part):
        return tokenizer.decode(part, skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)

    special = {i for i, flag in _added_ids(tokenizer).items() if flag}
    pieces = []
    prefix, read = 0, 0  # decode ids[prefix:] and keep what comes after ids[prefix:read]
    for k in range(len(ids)):
        before = decode(ids[prefix:read])
        now = decode(ids[prefix:k + 1])
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            # tokens read..k-1 added no text: theirs is held back until this one
            pieces.append(TokenPiece(now[len(before):], lead=k - read, special=ids[k] in special))
            prefix, read = read, k + 1
        else:
            pieces.append(TokenPiece("", special=ids[k] in special))
    return pieces


def token_label(tokenizer, token_id: int) -> str:
    """A short standalone text for one token id (key-token tables): its decoding, or its
    bytes in hex (``"<f0 9f>"``) when it holds only part of a character."""
    token_id = int(token_id)
    _check_ids(tokenizer, [token_id])
    text = tokenizer.decode([token_id], skip_special_tokens=False,
                            clean_up_tokenization_spaces=False)
    if REPLACEMENT in text and is_byte_level(tokenizer):
        s = tokenizer.convert_ids_to_tokens([token_id])[0] or ""
        table = _byte_decoder()
        if s and all(ch in table for ch in s):
            raw = bytes(table[ch] for ch in s)
            good = raw.decode("utf-8", errors="ignore")
            return good if good and good.encode() == raw else f"<{raw.hex(' ')}>"
    return text
