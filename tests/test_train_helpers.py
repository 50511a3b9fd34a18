"""Shared fixtures of the ``ktae train`` tests (no tests here).

A tiny random Llama (hidden 32, one layer) with the character tokenizer, saved once per
session, and a cheap stand-in reward: a response is "correct" when it contains a digit.
A random model writes one in about half of its 8-token responses, so most groups mix
correct and incorrect responses and the digit tokens are KTAE's key tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ktae.runs.config import TrainConfig
from ktae.train.trainer import KTAEGRPOTrainer

DETERMINISTIC_KEYS = ("reward", "accuracy", "response_length", "entropy", "loss", "grad_norm",
                      "clip_fraction", "zero_variance_group_fraction", "generation_rounds",
                      "flagged_token_rate")


def save_tiny_model(path: Path, seed: int = 0, max_position_embeddings: int = 128) -> Path:
    """The tiny random model and its tokenizer, saved under ``path`` (also used by the
    evaluation tests, whose prompts need more positions)."""
    from ktae.models import build_char_tokenizer, build_tiny_model

    torch.manual_seed(seed)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=32, num_layers=1, intermediate_size=64,
                             num_heads=2, seed=seed,
                             max_position_embeddings=max_position_embeddings)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def contains_digit(completions, **_):
    """1.0 when the response holds a digit, else 0.0."""
    return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


def tiny_config(model_path: Path, out: Path, **overrides) -> TrainConfig:
    base = dict(model=str(model_path), output_dir=str(out), max_steps=2, num_prompts=4,
                num_generations=4, max_new_tokens=8, train_size=64, eval_size=8, eval_every=0,
                save_every=0, progress=False)
    base.update(overrides)
    return TrainConfig(**base).resolve()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


class Recorder(KTAEGRPOTrainer):
    """Keeps what KTAE read (token mask) and what the loss reads (loss mask, advantages)."""

    seen: list

    def _finish_batch(self, batch, rewards, correct, mode, **kwargs):
        token_mask = batch["ktae_token_mask"].clone()
        out = super()._finish_batch(batch, rewards, correct, mode, **kwargs)
        self.seen.append({"ids": out["completion_ids"].clone(), "token_mask": token_mask,
                          "loss_mask": out["completion_mask"].clone(),
                          "adv": out["advantages"].clone(), "rewards": rewards.clone(),
                          "correct": correct.clone(), "ignore": list(self.ignore_token_ids)})
        return out


def assert_refused(main, capsys, out: Path, cases) -> None:
    """Each ``(args, match)`` of ``ktae train`` is one error line holding ``match``, exit
    status 2, and nothing written to ``out``."""
    for extra, match in cases:
        code = main(["train", "--output-dir", str(out), *extra])
        err = capsys.readouterr().err
        assert code == 2, (extra, err)
        assert match in err and err.count("\n") == 1, (extra, err)
        assert not out.exists()
