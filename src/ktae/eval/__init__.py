"""Benchmark evaluation: loaders, generation, scoring, ``ktae eval``.

Public API:
    load_benchmark(name, *, path=None, split=None, limit=None, field_map=None)
    evaluate(model, tokenizer, benchmarks, ...) -> dict
Needs the ``eval`` extra (transformers, datasets, rich, math-verify).
"""

from ktae.eval.benchmarks import (
    BENCHMARK_NAMES,
    BENCHMARKS,
    BenchmarkRecord,
    fixture_path,
    load_benchmark,
)
from ktae.eval.runner import evaluate, load_records

__all__ = ["BENCHMARKS", "BENCHMARK_NAMES", "BenchmarkRecord", "evaluate", "fixture_path",
           "load_benchmark", "load_records"]
