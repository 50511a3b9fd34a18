"""Benchmark evaluation: loaders, scoring, ``ktae eval`` (generation: :mod:`ktae.models.generate`).

Public API:
    load_benchmark(name, *, path=None, split=None, limit=None, field_map=None)
    evaluate(model, tokenizer, benchmarks, ...) -> dict
    generation_defaults(model_dir) -> dict          # a model's ktae_generation.json
    save_generation_defaults(model_dir, *, template, max_new_tokens) -> Path
    load_choice_benchmark(name, *, path=None, ...), letter_reward(completion, answer)
    PROTOCOLS, resolve_settings(benchmarks, *, protocol=None, ...)   # --protocol ktae|taco
    avg_at_k(correct), pass_at_k(num_correct, k), majority_at_k(classes, correct_class)
Needs the ``eval`` extra (transformers, datasets, rich, math-verify). ``evaluate`` and
``load_records`` are imported on first use, so ``ktae eval --help`` stays fast.
"""

from ktae.eval.benchmarks import (
    BENCHMARK_NAMES,
    BENCHMARKS,
    BenchmarkRecord,
    fixture_path,
    load_benchmark,
)
from ktae.eval.choice import CHOICE_BENCHMARKS, letter_reward, load_choice_benchmark
from ktae.eval.metrics import avg_at_k, majority_at_k, pass_at_k
from ktae.eval.protocols import PROTOCOLS, resolve_settings
from ktae.models.generation_defaults import GENERATION_FILE, generation_defaults, save_generation_defaults

__all__ = ["BENCHMARKS", "BENCHMARK_NAMES", "CHOICE_BENCHMARKS", "GENERATION_FILE", "PROTOCOLS",
           "BenchmarkRecord", "avg_at_k", "evaluate", "fixture_path", "generation_defaults",
           "letter_reward", "load_benchmark", "load_choice_benchmark", "load_records",
           "majority_at_k", "pass_at_k", "resolve_settings", "save_generation_defaults"]


def __getattr__(name: str):
    if name in ("evaluate", "load_records"):
        # on first use: the runner loads the benchmarks, graders and models, which
        # ``ktae.eval.prompts`` (read by ktae train) does not need
        from ktae.eval import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'ktae.eval' has no attribute {name!r}")
