"""Shared pieces of the ``ktae explain`` tests (no tests here).

A real byte-level BPE tokenizer trained with the ``tokenizers`` library on a tiny corpus
holding multi-byte characters (``é``, ``ç``, emoji), so that some characters are split
over several tokens and others are merged into longer tokens; a parser that collects
the token elements of a page.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

CORPUS = ["le café est très bon", "un café 😀 et un thé", "the sum is 42 😀😀",
          "naïve résumé café", "the answer is \\boxed{42}", "ça va, zoé? 🤖"] * 6


def byte_level_tokenizer(save_to: Path | None = None):
    """A byte-level BPE (GPT-2 style) ``PreTrainedTokenizerFast`` with ``<pad>``/``<eos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>")
    if save_to is not None:
        tok.save_pretrained(save_to)
    return tok


class TokenSpans(HTMLParser):
    """Collects ``<span class="tok ...">`` elements: attributes, text, and the group
    section and response block each sits in (document order)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tokens: list[dict] = []
        self._group = None
        self._resp = -1
        self._stack: list[dict | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "section" and "group" in classes:
            self._group, self._resp = a.get("id"), -1
        if tag == "div" and "resp" in classes:
            self._resp += 1
        if tag == "br":
            return
        if tag == "span" and "tok" in classes:
            rec = {"classes": classes, "style": a.get("style", ""), "title": a.get("title", ""),
                   "text": "", "group": self._group, "response": self._resp}
            self.tokens.append(rec)
            self._stack.append(rec)
        else:
            self._stack.append(None)

    def handle_endtag(self, tag):
        if tag != "br" and self._stack:
            self._stack.pop()

    def handle_data(self, data):
        for rec in self._stack:
            if rec is not None:
                rec["text"] += data


def token_spans(page: str) -> list[dict]:
    parser = TokenSpans()
    parser.feed(page)
    return parser.tokens


def colours(style: str) -> dict[int, tuple[int, int, int]]:
    """``{view index: (r, g, b)}`` of a token's ``--bN`` background variables."""
    out = {}
    for i, hexa in re.findall(r"--b(\d+):#([0-9a-f]{6})", style):
        out[int(i)] = tuple(int(hexa[k:k + 2], 16) for k in (0, 2, 4))
    return out


def tooltip_numbers(title: str) -> dict[str, float]:
    """``name=value`` pairs of a tooltip (a, b, ..., value, log p, entropy, weight)."""
    title = title.replace("log p=", "logp=")
    return {k: float(v) for k, v in re.findall(r"(\w+)=(-?[\d.]+(?:e[-+]?\d+)?|nan)", title)}
