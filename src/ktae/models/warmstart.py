"""Warm start of the embedded default model: SFT with a systematic, fixable slip.

Recipe (issue 5, "Embedded default model"): the tiny Llama of :mod:`ktae.models.tiny` is
trained on the answer tokens only of compact prompts ``Q:37+45-18 A:`` followed by
``worked_solution(problem, carry_noise=0.6)`` and ``<eos>``, so it learns to forget the
carry/borrow on a good share of the steps that need one. It starts well below its
ceiling (about 60% greedy accuracy, much lower on carry/borrow problems), which leaves
RL something specific to fix: a few key tokens (the carry digit) decide each answer.

Measured with the default recipe (seed 0, 900 steps, one torch thread on a shared 2-core
CPU under load: 28 min, 1.9 s/step): greedy accuracy 60.5% on 200 held-out
problems, 26% on the 106 that carry or borrow and 99% on the others; sampling at
temperature 1, 91% are solved at least once in 8 samples (34% of such groups all right,
9% all wrong).

:func:`default_model_path` builds that model once per recipe and caches it;
:func:`warm_start` is the reusable training function; :func:`greedy_accuracy` measures it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ktae.models.generate import SamplingConfig, generate_hf
from ktae.models.generation_defaults import GENERATION_FILE, save_generation_defaults
from ktae.models.tiny import build_tiny_model
from ktae.models.tokenizer import build_char_tokenizer
from ktae.rewards.extract import extract_boxed
from ktae.tasks.embedded import (
    Problem,
    format_prompt,
    generate,
    has_carry_or_borrow,
    worked_solution,
)

RECIPE_VERSION = 1  # bump when the training code changes what a recipe produces
METRICS_FILE = "warmstart.json"
TEMPLATE = "compact"
"""The prompt template of the SFT data (``Q:37+45-18 A:``)."""
MAX_NEW_TOKENS = 40
"""Response budget of its evaluation (and of the RL runs that start from it)."""
EVAL_SEED = 0  # the held-out problems are the same for every training seed
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class WarmStartRecipe:
    """Everything that determines the warm-started model; its hash names the cache entry."""

    seed: int = 0
    """Seeds model initialisation, the problem stream and the noise."""
    steps: int = 900
    """Optimiser steps (batches). Accuracy jumps between steps 400 and 600, then
    plateaus near the noise-limited greedy ceiling (seed 0, 1 thread: 56% at 600 planned
    steps, 60.5% at 900)."""
    batch_size: int = 128
    lr: float = 3e-3
    """Peak AdamW learning rate."""
    warmup_steps: int = 30
    """Linear warm-up steps, then cosine decay to ``min_lr_ratio * lr`` at ``steps``."""
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    carry_noise: float = 0.6
    """Probability of forgetting each carry/borrow in the training solutions."""
    hidden_size: int = 128
    num_layers: int = 4
    intermediate_size: int = 384
    num_heads: int = 4
    eval_size: int = 200
    """Held-out test problems for the greedy accuracy written to ``warmstart.json``."""

    def key(self) -> str:
        """Stable 12-hex-digit hash of the recipe (and :data:`RECIPE_VERSION`)."""
        payload = json.dumps({"version": RECIPE_VERSION, **dataclasses.asdict(self)},
                             sort_keys=True)
        return hashlib.blake2b(payload.encode(), digest_size=6).hexdigest()


# --------------------------------------------------------------------------- evaluation



def extract_boxed_int(text: str) -> int | None:
    """Integer in the last ``\\boxed{...}`` of ``text``; None if unclosed or not an integer.

    Strict on purpose: ``\\boxed{7`` (unclosed), ``\\boxed{7.0}`` and an unboxed ``7``
    give None. The extraction is the reward's (:func:`ktae.rewards.extract_boxed`).
    """
    inner = extract_boxed(text)
    inner = inner.strip() if inner is not None else ""
    return int(inner) if re.fullmatch(r"-?\d+", inner) else None


def greedy_accuracy(model, tokenizer, problems: list[Problem],
                    max_new_tokens: int = MAX_NEW_TOKENS, *, batch_size: int = 256,
                    template: str = TEMPLATE) -> dict:
    """Greedy pass@1 of ``model`` on ``problems`` (batched, left-padded generation).

    Returns ``accuracy`` overall, ``carry_accuracy`` on problems whose correct solution
    carries or borrows and ``other_accuracy`` on the rest (None when a subset is empty),
    per-level accuracies ``level_accuracy``, the counts, and ``formatted`` (share of
    completions with a strict integer ``\\boxed{}``). An empty list gives accuracy None.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    prompts = [format_prompt(p, template) for p in problems]
    gens = generate_hf(model, tokenizer, prompts,
                       SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
                       batch_size=batch_size)
    correct, formatted = [], []
    for p, g in zip(problems, gens, strict=True):
        got = extract_boxed_int(g[0].text)
        formatted.append(got is not None)
        correct.append(got is not None and got == int(p.answer))

    def mean(flags):
        return sum(flags) / len(flags) if flags else None

    carry = [has_carry_or_borrow(p) for p in problems]
    return {
        "n": len(problems),
        "accuracy": mean(correct),
        "formatted": mean(formatted),
        "n_carry": sum(carry),
        "carry_accuracy": mean([c for c, k in zip(correct, carry, strict=True) if k]),
        "other_accuracy": mean([c for c, k in zip(correct, carry, strict=True) if not k]),
        "level_accuracy": {
            str(lv): mean([c for c, p in zip(correct, problems, strict=True) if p.level == lv])
            for lv in sorted({p.level for p in problems})},
    }


# --------------------------------------------------------------------------- training


def lr_factor(step: int, *, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at ``step`` (0-based): linear warm-up, cosine to the floor."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def sft_batch(tokenizer, problems: list[Problem], rng: random.Random, carry_noise: float):
    """``input_ids, attention_mask, labels`` ``[N, L]`` (right-padded) for answer-only SFT.

    Each row is ``<bos> Q:... A:`` + noisy worked solution + ``<eos>``; ``labels`` is -100
    on the prompt and on padding, so the loss covers the completion and ``<eos>`` only.
    """
    import torch

    rows, starts = [], []
    for p in problems:
        prompt = tokenizer(format_prompt(p))["input_ids"]
        answer = tokenizer(worked_solution(p, carry_noise=carry_noise, rng=rng),
                           add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer + [tokenizer.eos_token_id])
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, s) in enumerate(zip(rows, starts, strict=True)):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
        labels[i, s:len(row)] = ids[i, s:len(row)]
    return ids, mask, labels


def warm_start(output_dir, *, steps: int, seed: int = 0, batch_size: int = 128,
               lr: float = 3e-3, progress: bool = True,
               recipe: WarmStartRecipe | None = None, eval_every: int = 0) -> dict:
    """Train the tiny model per ``recipe`` and save model, tokenizer and ``warmstart.json``.

    ``steps``, ``seed``, ``batch_size`` and ``lr`` override the recipe's fields (the
    other fields come from ``recipe`` or :class:`WarmStartRecipe` defaults). Writes into
    ``output_dir`` (created) with ``save_pretrained``, so ``--model output_dir`` and
    ``AutoModelForCausalLM/AutoTokenizer.from_pretrained`` load it, and
    ``ktae_generation.json`` (template ``compact``, 40 new tokens) for ``ktae eval``
    (:mod:`ktae.models.generation_defaults`). Deterministic for a
    seed on CPU with a fixed number of torch threads. Returns the metrics also written to
    ``warmstart.json``: the recipe, per-step ``losses``, ``train_seconds`` and the
    :func:`greedy_accuracy` of the final model on ``eval_size`` held-out test problems
    (``eval``), and with ``eval_every > 0`` the same every that many steps
    (``eval_history``; greedy evaluation does not change the training trajectory).
    """
    import torch

    recipe = dataclasses.replace(recipe or WarmStartRecipe(), steps=steps, seed=seed,
                                 batch_size=batch_size, lr=lr)
    _check_recipe(recipe)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=recipe.hidden_size,
                             num_layers=recipe.num_layers,
                             intermediate_size=recipe.intermediate_size,
                             num_heads=recipe.num_heads, seed=recipe.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr,
                                  weight_decay=recipe.weight_decay)
    stream = generate(recipe.steps * recipe.batch_size, split="train", seed=recipe.seed,
                      unique=False)
    noise_rng = random.Random(f"ktae-warmstart-noise:{recipe.seed}")
    held_out = generate(recipe.eval_size, split="test", seed=EVAL_SEED)
    losses: list[float] = []
    history: list[dict] = []
    t0 = time.perf_counter()
    with _progress(progress, recipe.steps) as bar:
        for step in range(recipe.steps):
            factor = lr_factor(step, steps=recipe.steps, warmup_steps=recipe.warmup_steps,
                               min_lr_ratio=recipe.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = recipe.lr * factor
            chunk = stream[step * recipe.batch_size:(step + 1) * recipe.batch_size]
            ids, mask, labels = sft_batch(tokenizer, chunk, noise_rng, recipe.carry_noise)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{recipe.lr * factor:.2e}",
                                **({"acc": f"{history[-1]['accuracy']:.3f}"} if history else {}))
            if eval_every > 0 and (step + 1) % eval_every == 0 and step + 1 < recipe.steps:
                history.append({"step": step + 1,
                                "seconds": round(time.perf_counter() - t0, 2),
                                **greedy_accuracy(model, tokenizer, held_out)})
    train_seconds = time.perf_counter() - t0
    model.eval()
    accuracy = greedy_accuracy(model, tokenizer, held_out)
    metrics = {
        "recipe": dataclasses.asdict(recipe),
        "recipe_key": recipe.key(),
        "recipe_version": RECIPE_VERSION,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": round(train_seconds, 2),
        "final_loss": losses[-1] if losses else None,
        "losses": losses,
        "eval": accuracy,
        "eval_history": history,
    }
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _save_generation_defaults(out)
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=1))  # last: marks complete
    return metrics


def _save_generation_defaults(model_dir: Path) -> None:
    """``ktae_generation.json``: ``ktae eval`` prompts the model as it was trained."""
    save_generation_defaults(model_dir, template=TEMPLATE, max_new_tokens=MAX_NEW_TOKENS)


def _check_recipe(r: WarmStartRecipe) -> None:
    for name in ("steps", "batch_size", "warmup_steps", "eval_size"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name != "batch_size" else 1):
            raise ValueError(f"{name}: expected a non-negative integer"
                             f"{' >= 1' if name == 'batch_size' else ''}, got {v!r}")
    if not (isinstance(r.lr, (int, float)) and r.lr > 0):
        raise ValueError(f"lr: expected a positive number, got {r.lr!r}")
    if isinstance(r.seed, bool) or not isinstance(r.seed, int):
        raise ValueError(f"seed: expected an integer, got {r.seed!r}")


@contextlib.contextmanager
def _progress(enabled: bool, total: int):
    if not enabled:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="warm start (embedded SFT)", unit="step", dynamic_ncols=True)
    try:
        yield bar
    finally:
        bar.close()


# --------------------------------------------------------------------------- cache


def default_cache_dir() -> Path:
    """``$KTAE_CACHE`` if set, else ``~/.cache/ktae``."""
    env = os.environ.get("KTAE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ktae"


#: Models built by :func:`default_model_path` and shipped as package data.
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"


def default_model_path(cache_dir=None, *, seed: int = 0, steps: int | None = None,
                       progress: bool = True, recipe: WarmStartRecipe | None = None,
                       rebuild: bool = False) -> Path:
    """Path of the warm-started default model for ``recipe``, building it on first use.

    The default recipe's model ships with the package (built by this function, 3.5 MB:
    ``ktae/models/shipped/``), so the default job starts at once; ``rebuild=True`` (or any
    other recipe or seed) trains it here instead.

    The entry ``<cache_dir>/embedded-<recipe hash>`` is built in a temporary directory
    beside it and renamed into place only when complete, under a file lock, so a
    concurrent build waits and reuses the result and a killed build never leaves a
    directory that looks valid. Leftover temporaries of dead builds are removed.
    ``seed`` and ``steps`` (None: the recipe's) override ``recipe`` (default
    :class:`WarmStartRecipe`); a changed recipe gets a new entry.
    """
    recipe = recipe or WarmStartRecipe()
    recipe = dataclasses.replace(recipe, seed=seed, steps=recipe.steps if steps is None else steps)
    _check_recipe(recipe)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    name = f"embedded-{recipe.key()}"
    if not rebuild and is_complete(SHIPPED_DIR / name):
        return SHIPPED_DIR / name
    final = root / name
    if is_complete(final) and not rebuild:
        if not (final / GENERATION_FILE).is_file():  # built before the file existed
            _save_generation_defaults(final)
        return final
    with _file_lock(root / f"{name}.lock"):
        if is_complete(final) and not rebuild:  # built by another process while we waited
            return final
        _remove_stale_temporaries(root)
        tmp = root / f"{_TMP_PREFIX}{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            warm_start(tmp, steps=recipe.steps, seed=recipe.seed, batch_size=recipe.batch_size,
                       lr=recipe.lr, progress=progress, recipe=recipe)
            if final.exists():  # an incomplete entry (not made by this code): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def is_complete(path: Path) -> bool:
    """True for a finished cache entry (its metrics file is the last thing written)."""
    return (path / METRICS_FILE).is_file() and (path / "config.json").is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temporaries(root: Path) -> None:
    """Delete ``.tmp-embedded-<key>-<pid>-*`` directories whose building process is gone.

    Any recipe's, so leftovers of a killed build of an older recipe go too; a live
    build (of any recipe) keeps its directory.
    """
    for tmp in root.glob(f"{_TMP_PREFIX}embedded-*"):
        match = re.fullmatch(rf"{re.escape(_TMP_PREFIX)}embedded-[0-9a-f]+-(\d+)-[0-9a-f]+",
                             tmp.name)
        if match and (int(match.group(1)) == os.getpid() or not _pid_alive(int(match.group(1)))):
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive advisory lock (released by the OS if the process dies); no-op off POSIX."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
