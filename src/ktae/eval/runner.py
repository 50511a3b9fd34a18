"""``evaluate``: generate, score and summarise a model on math benchmarks.

The same function serves ``ktae eval`` and the trainer's periodic evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

from ktae.eval.benchmarks import BenchmarkRecord, fixture_path, load_benchmark
from ktae.eval.defaults import resolve_generation
from ktae.eval.generate import Generation, SamplingConfig, generate_hf, generate_vllm
from ktae.eval.prompts import build_prompt, resolve_template, uses_chat_template
from ktae.eval.results import (
    benchmark_metrics,
    prepare_output_dir,
    sample_rows,
    summarize,
    write_results,
    write_samples,
)
from ktae.rewards import batch_math_reward, reward_stats


def load_records(names: Sequence[str], *, limit: int | None = None,
                 data_dir: str | Path | None = None, fixtures: bool = False,
                 split: str | None = None) -> dict[str, list[BenchmarkRecord]]:
    """Records of each named benchmark: from ``data_dir`` (``<name>.jsonl`` etc.,
    ``<name>/test.jsonl``, or a split of a dataset saved there with ``save_to_disk``;
    :func:`ktae.eval.benchmarks.load_benchmark`), from the shipped fixtures
    (``fixtures=True``), or from the hub. ``embedded`` is always generated."""
    out = {}
    for name in names:
        path = None
        if name != "embedded":
            if fixtures:
                path = fixture_path(name)
            elif data_dir is not None:
                path = Path(data_dir)
        out[name] = load_benchmark(name, path=path, limit=limit, split=split)
    return out


def _progress(show: bool):
    if not show:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn())


def _model_dir(model, model_path) -> str | None:
    """The directory the model was loaded from: ``model_path``, else transformers'
    ``name_or_path`` when it is a local directory."""
    if model_path is not None:
        return str(model_path)
    name = getattr(model, "name_or_path", None)
    return name if isinstance(name, str) and name and Path(name).is_dir() else None


def evaluate(model, tokenizer, benchmarks: Sequence[str] | Mapping[str, Sequence[BenchmarkRecord]],
             *, k: int = 1, temperature: float | None = None, top_p: float = 1.0,
             max_new_tokens: int | None = None, template: str | None = None, batch_size: int = 16,
             seed: int = 0, limit: int | None = None, output_dir: str | Path | None = None,
             timeout: float = 5.0, show_progress: bool = False, backend: str = "hf",
             model_path: str | None = None, config: Mapping | None = None) -> dict:
    """Evaluate ``model`` on ``benchmarks`` and return the results document.

    Args:
        model, tokenizer: a causal LM and its tokenizer (transformers); with
            ``backend="vllm"`` the model is ``model_path`` instead and ``model`` is unused.
        benchmarks: names for :func:`load_records` (hub / embedded), or a mapping
            ``name -> records`` already loaded (e.g. fixtures, a trainer's eval set).
        k, temperature, top_p, seed: decoding (:class:`SamplingConfig`); greedy pass@1
            by default, avg@k with sampling when ``k > 1``.
        max_new_tokens, template: response budget and prompt template
            (:mod:`ktae.eval.prompts`); None (default) takes them from the model's
            ``ktae_generation.json`` (:mod:`ktae.eval.defaults`: what ``ktae train`` and
            the shipped default model save), else 1024 and ``"auto"``.
        limit: first ``limit`` records of each benchmark.
        output_dir: if given, writes ``results.json`` and ``samples_<bench>.jsonl`` there
            (created, or refused, before anything is generated).
        timeout: verifier deadline per answer, seconds.
        show_progress: rich progress bar over prompts.
        model_path: the model's directory (vLLM loads it; both backends read its
            ``ktae_generation.json``); default: the ``name_or_path`` of ``model``.

    Returns:
        ``{"config", "benchmarks": {name: metrics}, "results", "avg", "avg_lens",
        "max_lens", "formatted"}`` (see :mod:`ktae.eval.results`), plus ``"samples":
        {name: rows}`` in memory only (not in ``results.json``). ``config`` records the
        template and budget used and where each came from (``template_source``,
        ``max_new_tokens_source``: ``"given"``, the file, or ``"default"``).

    Raises:
        ValueError: bad arguments, a benchmark with no records, an unusable output_dir.
    """
    if backend not in ("hf", "vllm"):
        raise ValueError(f"backend: expected 'hf' or 'vllm', got {backend!r}")
    choice = resolve_generation(_model_dir(model, model_path), template=template,
                                max_new_tokens=max_new_tokens)
    sampling = SamplingConfig(k=k, temperature=temperature, top_p=top_p,
                              max_new_tokens=choice.max_new_tokens, seed=seed)
    if isinstance(benchmarks, Mapping):
        records = {n: list(r)[:limit] if limit else list(r) for n, r in benchmarks.items()}
    elif isinstance(benchmarks, str) or not isinstance(benchmarks, Sequence) or not benchmarks:
        raise ValueError(f"benchmarks: expected a non-empty list of names or a mapping, "
                         f"got {benchmarks!r}")
    else:
        records = load_records(list(benchmarks), limit=limit)
    if not records:
        raise ValueError("benchmarks: expected at least one benchmark, got none")
    for name, recs in records.items():
        if not recs:
            raise ValueError(f"benchmarks: {name!r} has no records (nothing to score)")
    out_dir = prepare_output_dir(output_dir) if output_dir is not None else None
    resolved = resolve_template(choice.template, tokenizer)
    prompts = {n: [build_prompt(r, resolved, tokenizer) for r in recs]
               for n, recs in records.items()}
    timeouts_before = reward_stats()["timeouts"]

    per_bench, samples = {}, {}
    with _progress(show_progress) as progress:
        for name, recs in records.items():
            task = progress.add_task(name, total=len(recs)) if progress else None
            advance = (lambda n, t=task: progress.advance(t, n)) if progress else None
            if backend == "vllm":  # pragma: no cover - needs vLLM and a GPU
                gens = generate_vllm(model_path, prompts[name], sampling, on_batch=advance)
            else:
                gens = generate_hf(model, tokenizer, prompts[name], sampling,
                                   batch_size=batch_size, on_batch=advance,
                                   add_special_tokens=not uses_chat_template(resolved))
            flat: list[Generation] = [g for gs in gens for g in gs]
            rewards = batch_math_reward([g.text for g in flat],
                                        [r.answer for r in recs for _ in range(sampling.k)],
                                        timeout=timeout)
            samples[name] = sample_rows(recs, prompts[name], gens, rewards)
            per_bench[name] = benchmark_metrics(samples[name], k=sampling.k)

    run_config = {"k": sampling.k, "temperature": sampling.effective_temperature,
                  "top_p": sampling.top_p, "max_new_tokens": sampling.max_new_tokens,
                  "template": resolved, "seed": seed, "limit": limit, "backend": backend,
                  "template_source": choice.template_source,
                  "max_new_tokens_source": choice.max_new_tokens_source,
                  "verifier_timeouts": reward_stats()["timeouts"] - timeouts_before,
                  **dict(config or {})}
    results = summarize(per_bench, run_config)
    if out_dir is not None:
        write_results(out_dir / "results.json", results)
        for name, rows in samples.items():
            write_samples(out_dir / f"samples_{name}.jsonl", rows)
    results["samples"] = samples
    return results
