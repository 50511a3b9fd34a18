"""A character-level tokenizer for the embedded default model.

One token per character of printable ASCII (digits, ``+ - * = .``, space, letters,
``\\ { }``, ...) and newline, plus ``<pad> <bos> <eos> <unk>``. It is a plain
``tokenizers`` pipeline wrapped in :class:`~transformers.PreTrainedTokenizerFast`, so a
saved copy reloads with ``AutoTokenizer.from_pretrained(dir)`` and no custom code, and
TRL, ``generate`` and ``ktae eval`` use it like any hub tokenizer.

* Encoding prepends ``<bos>`` (as Llama tokenizers do; TRL tokenises prompts with special
  tokens, so training and RL see the same sequences). ``<eos>`` is never added: the
  warm start appends it to completions and generation stops on it.
* Decoding concatenates characters, so ``decode(encode(s), skip_special_tokens=True) == s``
  for any text over the alphabet, spaces and newlines included. Other characters encode
  to ``<unk>`` (dropped by ``skip_special_tokens``).
* Padding is on the left, as batched generation needs.
"""

from __future__ import annotations

import string

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = tuple(c for c in string.printable if c not in "\t\r\x0b\x0c")
"""The 95 printable ASCII characters and ``"\\n"``, one token each (after the specials)."""

MODEL_MAX_LENGTH = 128


def build_char_tokenizer():
    """The character tokenizer (vocabulary ``SPECIAL_TOKENS + ALPHABET``, 100 tokens).

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then :data:`ALPHABET` in order.
    Returns a :class:`~transformers.PreTrainedTokenizerFast` with ``padding_side="left"``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + ALPHABET)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    bos = vocab["<bos>"]
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", padding_side="left", model_max_length=MODEL_MAX_LENGTH)


def warn_unknown_characters(texts, tokenizer, what: str = "prompts") -> set[str]:
    """Warn once, naming them, about the characters of ``texts`` that a character-level
    tokenizer (this one, or any with a small vocabulary and an ``<unk>`` token) cannot
    represent: they become ``<unk>`` and vanish from what the model sees. Returns them."""
    vocab = tokenizer.get_vocab() if len(tokenizer) < 1000 else None
    if vocab is None or getattr(tokenizer, "unk_token", None) is None:
        return set()
    unknown = {c for t in texts for c in set(t)} - set(vocab)
    if unknown:
        import warnings

        shown = ", ".join(repr(c) for c in sorted(unknown)[:20])
        warnings.warn(f"{len(unknown)} character(s) of the {what} are not in the tokenizer's "
                      f"vocabulary and are dropped: {shown}"
                      + (", ..." if len(unknown) > 20 else ""), stacklevel=2)
    return unknown
