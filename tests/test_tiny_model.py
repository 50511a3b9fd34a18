"""The embedded default model: character tokenizer, tiny Llama, cached warm start."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoTokenizer  # noqa: E402

from ktae.models import ALPHABET, SPECIAL_TOKENS, build_char_tokenizer, build_tiny_model  # noqa: E402
from ktae.tasks.embedded import format_prompt, generate, worked_solution  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


TEXTS = [
    "Q:37+45-18 A:37+45=82. 82-18=64. \\boxed{64}",
    "  leading and  double  spaces ",
    "Compute 5+3*4.\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_including_spaces(tok, text):
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1  # one token per character, plus <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.convert_ids_to_tokens(ids[1:]) == list(text)


def test_vocabulary_and_special_ids(tok):
    assert len(tok) == len(SPECIAL_TOKENS) + len(ALPHABET) == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left"
    for ch in "0123456789+-*=. QA:\\boxed{}":
        assert tok.convert_tokens_to_ids(ch) != tok.unk_token_id
    # Characters outside the alphabet become <unk>, dropped when skipping specials.
    ids = tok("1é2")["input_ids"]
    assert ids[2] == tok.unk_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "12"


def test_left_padding_batch(tok):
    batch = tok(["Q:1+2 A:", "Q:37+45-18 A:"], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (2, 14)
    assert ids[0, :5].tolist() == [tok.pad_token_id] * 5 and mask[0, :5].sum() == 0
    assert ids[0, 5] == tok.bos_token_id and mask[1].all()


def test_reloads_with_autotokenizer_next_to_a_llama_config(tok, tmp_path):
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]
        assert again.decode(again(text)["input_ids"], skip_special_tokens=True) == text
    assert again.padding_side == "left"
    assert (again.pad_token, again.bos_token, again.eos_token) == ("<pad>", "<bos>", "<eos>")


def test_tiny_model_size_ties_and_ids(tok):
    model = build_tiny_model(tok)
    n = sum(p.numel() for p in model.parameters())
    # 4 x (4*128^2 attention + 3*128*384 FFN + 2*128 norms) + 100*128 embedding + 128 norm
    assert n == 4 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128) + 100 * 128 + 128 == 865_920
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = model.config
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 2, 0)
    assert cfg.max_position_embeddings == 128 and cfg.model_type == "llama"
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_tiny_model_deterministic_for_seed(tok):
    state = torch.random.get_rng_state()
    a, b = build_tiny_model(tok, seed=3), build_tiny_model(tok, seed=3)
    c = build_tiny_model(tok, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # global RNG untouched
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_tiny_model_forward_on_task_text(tok):
    torch.set_num_threads(1)
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64)
    p = generate(2)
    texts = [format_prompt(x) + worked_solution(x) for x in p]
    batch = tok(texts, padding=True, return_tensors="pt")
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (*batch["input_ids"].shape, len(tok))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("kwargs, name", [
    ({"hidden_size": 0}, "hidden_size"), ({"num_heads": 3}, "num_heads"),
    ({"num_layers": 1.5}, "num_layers"),
])
def test_tiny_model_rejects_bad_sizes(tok, kwargs, name):
    with pytest.raises(ValueError, match=name):
        build_tiny_model(tok, **kwargs)
