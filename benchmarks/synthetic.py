"""Realistic synthetic RLVR batches for benchmarks (no model, no hub).

Token ids follow a Zipf law over the vocabulary, mixed with a per-prompt "topic"
vocabulary (responses to one prompt share many tokens, as real rollouts do); each group
gets an outcome profile (all correct, all wrong, or mixed); response lengths vary and
the rest of each row is padding.

``zipf=True`` (:func:`make_batch`) draws every token from one Zipf law over the whole
vocabulary instead, with log-normal response lengths (heavy-tailed, as generated text):
no topic vocabulary, so a group holds more distinct tokens, spread over the whole id
range: the hard case for counting by tables indexed by token id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRESETS = {
    # name: (prompts, responses per prompt, max response length, vocabulary)
    "small": (64, 8, 512, 151_936),
    "medium": (256, 16, 1024, 151_936),
    "large": (512, 8, 4096, 151_936),
    "paper": (1024, 16, 3072, 151_936),
}


@dataclass
class SyntheticBatch:
    rewards: torch.Tensor  # [B] float32 in {0, 1}
    group: torch.Tensor  # [B] int64
    token_ids: torch.Tensor  # [B, T] int64
    mask: torch.Tensor  # [B, T] bool

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def _zipf_sample(n: int, vocab: int, s: float, gen: torch.Generator) -> torch.Tensor:
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    cdf = torch.cumsum(ranks.pow(-s), 0)
    cdf /= cdf[-1].clone()
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    return torch.searchsorted(cdf, u).clamp_max(vocab - 1)


#: ``zipf=True``: the Zipf exponent of the token ids (about 1 for words in text) and the
#: log-normal lengths' median and log-scale (before clipping to ``[1, max_len]``).
ZIPF_EXPONENT = 1.0
ZIPF_MEDIAN_LENGTH = 0.4
ZIPF_LENGTH_SIGMA = 0.8


def _zipf_batch(prompts: int, per_prompt: int, max_len: int, vocab: int,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_ids [B, T]`` from one Zipf law over the vocabulary, ``lengths [B]``
    log-normal with median ``ZIPF_MEDIAN_LENGTH * max_len``."""
    B = prompts * per_prompt
    perm = torch.randperm(vocab, generator=gen)
    token_ids = perm[_zipf_sample(B * max_len, vocab, ZIPF_EXPONENT, gen)].view(B, max_len)
    z = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = (ZIPF_MEDIAN_LENGTH * max_len * torch.exp(ZIPF_LENGTH_SIGMA * z)).long()
    return token_ids, lengths.clamp(1, max_len)


def make_batch(prompts: int, per_prompt: int, max_len: int, vocab: int = 151_936, *,
               seed: int = 0, topic_size: int = 2048, zipf: bool = False,
               device: str = "cpu") -> SyntheticBatch:
    gen = torch.Generator().manual_seed(seed)
    B = prompts * per_prompt
    rows_prompt = torch.arange(B) // per_prompt
    if zipf:
        token_ids, lengths = _zipf_batch(prompts, per_prompt, max_len, vocab, gen)
        return _finish(token_ids, lengths, prompts, rows_prompt, gen, device)
    # Global Zipf ids are shuffled so frequent tokens are spread over the id range.
    perm = torch.randperm(vocab, generator=gen)
    glob = perm[_zipf_sample(B * max_len, vocab, 1.1, gen)].view(B, max_len)
    topic_vocab = torch.randint(0, vocab, (prompts, topic_size), generator=gen)
    topic_rank = _zipf_sample(B * max_len, topic_size, 1.0, gen).view(B, max_len)
    topic = topic_vocab[rows_prompt[:, None], topic_rank]
    use_topic = torch.rand(B, max_len, generator=gen) < 0.5
    token_ids = torch.where(use_topic, topic, glob)
    del glob, topic, topic_rank, use_topic
    lengths = (max_len * torch.rand(B, generator=gen).pow(0.7)).long().clamp_min(1)
    return _finish(token_ids, lengths, prompts, rows_prompt, gen, device)


def _finish(token_ids: torch.Tensor, lengths: torch.Tensor, prompts: int,
            rows_prompt: torch.Tensor, gen: torch.Generator, device: str) -> SyntheticBatch:
    """Padding after each length, a few empty responses, and each group's outcomes."""
    B, max_len = token_ids.shape
    lengths[torch.rand(B, generator=gen) < 0.01] = 0  # a few empty responses
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    # Outcome profile per group: 40% all-correct, 15% all-wrong, rest mixed.
    profile = torch.rand(prompts, generator=gen)
    p_correct = torch.where(profile < 0.4, 1.0, torch.where(profile < 0.55, 0.0, 0.5))
    rewards = (torch.rand(B, generator=gen) < p_correct[rows_prompt]).float()
    return SyntheticBatch(rewards.to(device), rows_prompt.to(device), token_ids.to(device),
                          mask.to(device))
