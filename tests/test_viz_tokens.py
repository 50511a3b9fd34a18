"""Per-token text from a tokenizer: byte-level BPE (split and merged multi-byte characters),
incremental decoding for other tokenizers, and the character tokenizer of the tiny model."""

from __future__ import annotations

import pytest
from test_explain_helpers import byte_level_tokenizer

from ktae.viz.tokens import is_byte_level, token_label, token_pieces

TEXTS = ["un café 😀 et un thé", "zoé 🤖 ça", "naïve résumé 42", "🤖🤖 é", ""]


@pytest.fixture(scope="module")
def bpe():
    return byte_level_tokenizer()


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_pieces_rebuild_the_text_and_keep_characters_whole(bpe, text):
    assert is_byte_level(bpe)
    ids = bpe(text, add_special_tokens=False)["input_ids"] + [bpe.eos_token_id]
    pieces = token_pieces(bpe, ids)
    assert len(pieces) == len(ids)
    assert "".join(p.text for p in pieces) == text + "<eos>" == bpe.decode(ids)
    assert all("\ufffd" not in p.text for p in pieces)
    # every token's bytes, concatenated, are the UTF-8 text; a token with no text of its
    # own holds the first bytes of a character completed by a later token
    raw = b"".join(p.raw for p in pieces if p.raw is not None)
    assert raw == text.encode("utf-8")
    for k, p in enumerate(pieces[:-1]):
        if p.text == "":
            assert p.raw and k + 1 < len(pieces)


def test_split_and_merged_multibyte_tokens_are_both_exercised(bpe):
    # the corpus makes "café" and "😀" merged tokens and leaves "🤖" split over bytes
    merged = bpe(" café 😀", add_special_tokens=False)["input_ids"]
    assert [p.text for p in token_pieces(bpe, merged)] == [" café", " 😀"]
    split = bpe("🤖", add_special_tokens=False)["input_ids"]
    pieces = token_pieces(bpe, split)
    assert len(split) > 1 and [p.text for p in pieces][-1] == "🤖"
    assert all(p.text == "" for p in pieces[:-1])
    assert token_label(bpe, split[0]).startswith("<f0")  # part of a character: its bytes
    assert token_label(bpe, merged[0]) == " café"


def test_incremental_decoding_for_other_tokenizers():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.train_from_iterator(["le café est très bon", "zoé et thé"] * 4,
                             trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")
    assert not is_byte_level(tok)
    text = "le café et thé"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tok, ids)
    assert "".join(p.text for p in pieces) == tok.decode(ids) == text
    assert all(p.raw is None for p in pieces)


def test_character_tokenizer_one_character_per_token():
    from ktae.models import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = tok("1+2=3.\n \\boxed{3}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert [p.text for p in token_pieces(tok, ids)] == [*"1+2=3.\n \\boxed{3}", "<eos>"]


def test_ids_outside_the_vocabulary_are_refused(bpe):
    with pytest.raises(ValueError, match="^token_ids: id 5000 is outside"):
        token_pieces(bpe, [1, 5000])
