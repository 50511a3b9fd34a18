"""Benchmark evaluation: loaders, generation, scoring, ``ktae eval``.

Public API:
    load_benchmark(name, *, path=None, split=None, limit=None, field_map=None)
    evaluate(model, tokenizer, benchmarks, ...) -> dict
    generation_defaults(model_dir) -> dict          # a model's ktae_generation.json
    save_generation_defaults(model_dir, *, template, max_new_tokens) -> Path
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
from ktae.eval.defaults import GENERATION_FILE, generation_defaults, save_generation_defaults

__all__ = ["BENCHMARKS", "BENCHMARK_NAMES", "GENERATION_FILE", "BenchmarkRecord", "evaluate",
           "fixture_path", "generation_defaults", "load_benchmark", "load_records",
           "save_generation_defaults"]


def __getattr__(name: str):
    if name in ("evaluate", "load_records"):
        from ktae.eval import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'ktae.eval' has no attribute {name!r}")
