"""``evaluate``: generate, score and summarise a model on math benchmarks.

The same function serves ``ktae eval`` and the trainer's periodic evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from ktae.data import load_examples
from ktae.eval import choice, vllm_engine
from ktae.eval.benchmarks import (
    BENCHMARKS,
    GENERATED,
    BenchmarkRecord,
    benchmark_rows,
    fixture_path,
    load_benchmark,
)
from ktae.eval.context import check_prompts, model_context
from ktae.eval.graders import get_grader
from ktae.eval.metrics import answer_classes, candidate_pairs
from ktae.eval.prompts import build_prompt, resolve_template, uses_chat_template
from ktae.eval.provenance import records_sha256
from ktae.eval.results import (
    benchmark_metrics,
    prepare_output_dir,
    sample_rows,
    summarize,
    write_results,
    write_samples,
)
from ktae.models.generate import (
    Generation,
    SamplingConfig,
    generate_hf,
    hf_generate_kwargs,
)
from ktae.models.generation_defaults import GenerationChoice, resolve_generation
from ktae.models.tokenizer import warn_unknown_characters
from ktae.rewards import RewardResult, batch_math_reward, reward_stats
from ktae.rewards.ends import DEFAULT_CUT_OFF, check_cut_off_rule, require_end
from ktae.rewards.registry import get_reward


def load_records(names: Sequence[str], *, limit: int | None = None,
                 data_dir: str | Path | None = None, fixtures: bool = False,
                 split: str | None = None,
                 hub_sources: Mapping[str, tuple[str, str]] | None = None
                 ) -> dict[str, list[BenchmarkRecord]]:
    """Records of each named benchmark: from ``data_dir`` (``<name>.jsonl`` etc.,
    ``<name>/test.jsonl``, or a split of a dataset saved there with ``save_to_disk``;
    :func:`ktae.eval.benchmarks.load_benchmark`), from the shipped fixtures
    (``fixtures=True``), or from the hub. ``embedded`` and ``arith`` are always generated;
    ``mmlu_pro`` and ``gpqa_diamond`` are read by :mod:`ktae.eval.choice`.
    ``hub_sources``: benchmark -> (hub dataset, split) read instead of ktae's own hub
    source when the records come from the hub (a protocol's, e.g. TACO's AIME sets)."""
    out = {}
    for name in names:
        path = None
        is_choice = name in choice.CHOICE_BENCHMARKS
        if name not in GENERATED:
            if fixtures:
                path = choice.fixture_path(name) if is_choice else fixture_path(name)
            elif data_dir is not None:
                path = Path(data_dir)
        if is_choice:
            out[name] = choice.load_choice_benchmark(name, path=path, limit=limit, split=split)
        elif path is None and name in (hub_sources or {}):
            out[name] = _load_hub_source(name, *hub_sources[name], limit=limit, split=split)
        else:
            out[name] = load_benchmark(name, path=path, limit=limit, split=split)
    return out


def _load_hub_source(name: str, hub_path: str, hub_split: str, *, limit, split
                     ) -> list[BenchmarkRecord]:
    from dataclasses import replace

    spec = replace(BENCHMARKS[name], hub_path=hub_path, hub_config=None, split=hub_split)
    rows = benchmark_rows(name, spec, split=split)
    examples = load_examples(rows, limit=limit, preferred=spec.fields,
                             parse_answer=spec.parse_answer)
    return [BenchmarkRecord(id=e.id, problem=e.problem, answer=e.answer, source=name)
            for e in examples]


def _k_of(k, names) -> dict[str, int]:
    if isinstance(k, Mapping):
        missing = [n for n in names if n not in k]
        if missing:
            raise ValueError(f"k: no sample count for {', '.join(missing)}")
        return {n: k[n] for n in names}
    return dict.fromkeys(names, k)


def verify_responses(name: str, texts: list[str], answers: list, timeout: float,
                     grader: str = "default", *, truncated: Sequence[bool] | None = None,
                     cut_off: str = DEFAULT_CUT_OFF) -> list[RewardResult]:
    """Scores of one benchmark's responses: the option letter for multiple-choice
    benchmarks, the ``grader`` of :mod:`ktae.eval.graders` otherwise; a response flagged
    in ``truncated`` (cut at the budget) is wrong unless ``cut_off="read"``
    (:mod:`ktae.rewards.ends`)."""
    if name in choice.CHOICE_BENCHMARKS:
        results = [choice.letter_reward(t, a) for t, a in zip(texts, answers, strict=True)]
    elif name == "arith":  # the task's own answer format, whatever the grader
        results = get_reward("number").score(texts, answers, timeout=timeout)
    else:
        results = get_grader(grader).grade(texts, answers, timeout=timeout)
    if truncated is None:
        return results
    return require_end(results, truncated, rule=cut_off)


def vote_classes(name: str, rewards: list[RewardResult], k: int, timeout: float
                  ) -> list[int]:
    """Each sample's class of equivalent answers within its problem (maj@k). Distinct
    math answers that are not correct are compared with the verifier (every pair of the
    benchmark in one parallel batch); letters are equal or not."""
    problems = [rewards[i:i + k] for i in range(0, len(rewards), k)]
    answers = [[r.extracted if r.formatted else None for r in rs] for rs in problems]
    correct = [[r.correct for r in rs] for rs in problems]
    verdict: dict[tuple[str, str], bool] = {}
    if name not in choice.CHOICE_BENCHMARKS:
        pairs = list(dict.fromkeys(p for a, ok in zip(answers, correct, strict=True)
                                   for p in candidate_pairs(a, ok)))
        checked = batch_math_reward([f"\\boxed{{{a}}}" for a, _ in pairs],
                                    [b for _, b in pairs], timeout=timeout)
        verdict = {p: r.correct for p, r in zip(pairs, checked, strict=True)}
    out = []
    for a, ok in zip(answers, correct, strict=True):
        out.extend(answer_classes(a, ok, lambda x, y: verdict.get((x, y), False))[0])
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
             *, k: int | Mapping[str, int] = 1, temperature: float | None = None,
             top_p: float = 1.0, max_new_tokens: int | None = None, template: str | None = None,
             batch_size: int = 16, seed: int = 0, limit: int | None = None,
             output_dir: str | Path | None = None, timeout: float = 5.0,
             show_progress: bool = False, backend: str = "hf", model_path: str | None = None,
             dtype: str = "auto", config: Mapping | None = None, long_prompts: str = "error",
             data: Mapping[str, Mapping] | None = None, grader: str = "default",
             verbose: bool = False, cut_off: str = DEFAULT_CUT_OFF) -> dict:
    """Evaluate ``model`` on ``benchmarks`` and return the results document.

    Args:
        model, tokenizer: a causal LM and its tokenizer (transformers); with
            ``backend="vllm"`` the model is ``model_path`` instead and ``model`` is unused.
        benchmarks: names for :func:`load_records` (hub / embedded), or a mapping
            ``name -> records`` already loaded (e.g. fixtures, a trainer's eval set).
        k: samples per problem, one int or ``{benchmark: k}`` covering every benchmark.
        temperature, top_p, seed: decoding (:class:`SamplingConfig`); greedy pass@1
            by default, avg@k with sampling when ``k > 1`` (temperature None: 0 for a
            benchmark with k = 1, 0.6 otherwise).
        max_new_tokens, template: response budget and prompt template
            (:mod:`ktae.eval.prompts`); None (default) takes them from the model's
            ``ktae_generation.json`` (:mod:`ktae.models.generation_defaults`: what ``ktae train`` and
            the shipped default model save), else 1024 and ``"auto"``.
        limit: first ``limit`` records of each benchmark.
        output_dir: if given, writes ``results.json`` and ``samples_<bench>.jsonl`` there
            (created, or refused, before anything is generated).
        timeout: verifier deadline per answer, seconds.
        show_progress: rich progress bar over prompts.
        model_path: the model's directory (vLLM loads it; both backends read its
            ``ktae_generation.json``); default: the ``name_or_path`` of ``model``.
        dtype: vLLM's weights dtype (the transformers model is already loaded); the
            dtype the engine runs in is recorded under ``config.engine``.
        verbose: vLLM's start-up log (quiet otherwise).
        grader: the math grader (:mod:`ktae.eval.graders`), recorded in the config.
        cut_off: a response cut at ``max_new_tokens`` without ending is ``"wrong"``
            (default) or ``"read"`` from its text (:mod:`ktae.rewards.ends`); recorded in
            the config as ``cut_off_answers``.
        long_prompts: what happens to prompts that do not fit in the model's context:
            ``"error"`` (default: refused before anything is generated), ``"skip"`` or
            ``"truncate"`` (:mod:`ktae.eval.context`; reported per benchmark as
            ``long_prompts``).
        data: per benchmark, where its problems came from
            (:func:`ktae.eval.provenance.data_origin`); recorded under ``data`` with the
            row count and the sha256 of the problems.

    Returns:
        ``{"config", "benchmarks": {name: metrics}, "results", "avg", "avg_lens",
        "max_lens", "formatted"}`` (see :mod:`ktae.eval.results`), plus ``"samples":
        {name: rows}`` in memory only (not in ``results.json``), and ``"data"``: per
        benchmark, its origin, ``rows`` and ``sha256``. ``config`` records the
        template and budget used and where each came from (``template_source``,
        ``max_new_tokens_source``: ``"given"``, the file, or ``"default"``), ``k`` per
        benchmark and ``backend_arguments``: per benchmark, the decoding arguments the
        backend received (:func:`~ktae.models.generate.hf_generate_kwargs` or
        :func:`~ktae.eval.vllm_engine.engine_sampling_kwargs`); with vLLM, ``engine``:
        the engine's settings that change samples
        (:func:`~ktae.eval.vllm_engine.engine_settings`: its version, its actual dtype,
        ...).

    Raises:
        ValueError: bad arguments, a benchmark with no records, prompts that do not fit
            in the model's context (``long_prompts="error"``), an unusable output_dir.
    """
    _check_options(backend, grader, cut_off)
    choice_of = resolve_generation(_model_dir(model, model_path), template=template,
                                   max_new_tokens=max_new_tokens)
    plan = _plan(_benchmark_records(benchmarks, limit), tokenizer, choice_of, k=k,
                 temperature=temperature, top_p=top_p, seed=seed, data=data)
    # Every benchmark's prompts are checked against the context before anything runs.
    _fit_prompts(plan, tokenizer, model_context(model if backend == "hf" else None,
                                                _model_dir(model, model_path) or model_path),
                 long_prompts)
    out_dir = prepare_output_dir(output_dir) if output_dir is not None else None
    timeouts_before = reward_stats()["timeouts"]
    engine = _Backend.start(backend, model, tokenizer, model_path=model_path, dtype=dtype,
                            seed=seed, verbose=verbose, batch_size=batch_size,
                            add_special_tokens=plan.add_special_tokens)
    per_bench, samples = {}, {}
    with _progress(show_progress) as progress:
        for name in plan.records:
            samples[name], per_bench[name] = _run_benchmark(
                name, plan, engine, progress, timeout=timeout, grader=grader, cut_off=cut_off)
    run_config = _run_config(plan, engine, seed=seed, limit=limit, grader=grader,
                             cut_off=cut_off, long_prompts=long_prompts, config=config,
                             timeouts=reward_stats()["timeouts"] - timeouts_before)
    results = summarize(per_bench, run_config)
    results["data"] = plan.data
    if out_dir is not None:
        _write_outputs(out_dir, results, samples)
    results["samples"] = samples
    return results


def _check_options(backend: str, grader: str, cut_off: str) -> None:
    """Refuse an unknown backend, grader or cut-off rule."""
    if backend not in ("hf", "vllm"):
        raise ValueError(f"backend: expected 'hf' or 'vllm', got {backend!r}")
    get_grader(grader)
    check_cut_off_rule(cut_off, "cut_off")


def _benchmark_records(benchmarks, limit: int | None) -> dict[str, list[BenchmarkRecord]]:
    """Each benchmark's records (the first ``limit``): given, or loaded by name."""
    if isinstance(benchmarks, Mapping):
        records = {n: list(r)[:limit] if limit else list(r) for n, r in benchmarks.items()}
    elif isinstance(benchmarks, str) or not isinstance(benchmarks, Sequence) or not benchmarks:
        raise ValueError(f"benchmarks: expected a non-empty list of names or a mapping, "
                         f"got {benchmarks!r}")
    else:
        records = load_records(list(benchmarks), limit=limit)
    if not records:
        raise ValueError("benchmarks: expected at least one benchmark, got none")
    return records


@dataclass
class _EvalPlan:
    """What :func:`evaluate` runs: per benchmark its records, prompts and sampling."""

    records: dict[str, list[BenchmarkRecord]]
    prompts: dict[str, list[str]]
    sampling: dict[str, SamplingConfig]
    choice: GenerationChoice
    """The budget and template asked for, and where each came from."""
    template: str
    """The template the prompts were built with (``"auto"`` resolved)."""
    data: dict[str, dict]
    """Per benchmark: where its problems came from, ``rows`` and ``sha256``."""
    long_report: dict[str, dict] = field(default_factory=dict)
    """Per benchmark: what :func:`ktae.eval.context.check_prompts` did to long prompts."""

    @property
    def add_special_tokens(self) -> bool:
        """Whether the tokenizer adds its special tokens (not with a chat template)."""
        return not uses_chat_template(self.template)


def _plan(records: dict[str, list[BenchmarkRecord]], tokenizer, choice_of: GenerationChoice,
          *, k, temperature, top_p, seed, data) -> _EvalPlan:
    """Each benchmark's sampling settings, data record and prompts."""
    sampling = {n: SamplingConfig(k=kn, temperature=temperature, top_p=top_p,
                                  max_new_tokens=choice_of.max_new_tokens, seed=seed)
                for n, kn in _k_of(k, list(records)).items()}
    for name, recs in records.items():
        if not recs:
            raise ValueError(f"benchmarks: {name!r} has no records (nothing to score)")
    data_used = {n: {**dict((data or {}).get(n, {"source": "given"})), "rows": len(recs),
                     "sha256": records_sha256(recs)} for n, recs in records.items()}
    resolved = resolve_template(choice_of.template, tokenizer)
    prompts = {n: [build_prompt(r, resolved, tokenizer) for r in recs]
               for n, recs in records.items()}
    return _EvalPlan(records, prompts, sampling, choice_of, resolved, data_used)


def _fit_prompts(plan: _EvalPlan, tokenizer, context, rule: str) -> None:
    """Check every prompt against the model's ``context`` (``long_prompts`` ``rule``):
    refuse, skip or truncate the long ones, and record what was done in ``plan``."""
    warn_unknown_characters([p for ps in plan.prompts.values() for p in ps], tokenizer)
    for name in list(plan.records):
        plan.records[name], plan.prompts[name], plan.long_report[name] = check_prompts(
            name, plan.records[name], plan.prompts[name], tokenizer, context=context,
            max_new_tokens=plan.choice.max_new_tokens, rule=rule,
            add_special_tokens=plan.add_special_tokens)


@dataclass
class _Backend:
    """The engine that samples: transformers' ``generate`` or a vLLM engine."""

    name: str
    model: object
    tokenizer: object
    batch_size: int
    add_special_tokens: bool
    llm: object = None
    settings: dict = field(default_factory=dict)
    """vLLM's ``{"engine": settings that change samples}``; empty for transformers."""

    @classmethod
    def start(cls, name, model, tokenizer, *, model_path, dtype, seed, verbose, batch_size,
              add_special_tokens) -> _Backend:
        """The backend ``name``; for vLLM, its engine loaded from ``model_path``."""
        backend = cls(name, model, tokenizer, batch_size, add_special_tokens)
        if name == "vllm":  # tests/vllm_backend, in an environment with vLLM
            backend.llm = vllm_engine.load_vllm(model_path, dtype=dtype, seed=seed,
                                                verbose=verbose)
            backend.settings = {"engine": vllm_engine.engine_settings(
                backend.llm, requested_dtype=dtype)}
        return backend

    def arguments(self, sampling: SamplingConfig) -> dict:
        """The decoding arguments this backend receives for ``sampling``."""
        if self.name == "vllm":
            return vllm_engine.engine_sampling_kwargs(sampling)
        return hf_generate_kwargs(sampling)

    def generate(self, prompts: list[str], sampling: SamplingConfig, on_batch
                 ) -> list[list[Generation]]:
        """``k`` generations per prompt; long prompts are counted in ``long_prompts``."""
        if self.name == "vllm":
            return vllm_engine.generate_vllm(
                self.llm, self.tokenizer, prompts, sampling, on_batch=on_batch,
                add_special_tokens=self.add_special_tokens,
                warn=False)  # counted in long_prompts.budget_cut
        return generate_hf(self.model, self.tokenizer, prompts, sampling,
                           batch_size=self.batch_size, on_batch=on_batch,
                           add_special_tokens=self.add_special_tokens,
                           warn=False)  # counted in long_prompts.budget_cut


def _run_benchmark(name: str, plan: _EvalPlan, backend: _Backend, progress, *,
                   timeout: float, grader: str, cut_off: str) -> tuple[list[dict], dict]:
    """Generate, score and summarise one benchmark: ``(sample rows, metrics)``."""
    recs, s = plan.records[name], plan.sampling[name]
    task = progress.add_task(name, total=len(recs)) if progress else None
    advance = (lambda n, t=task: progress.advance(t, n)) if progress else None
    started = time.perf_counter()
    gens = backend.generate(plan.prompts[name], s, advance)
    seconds = time.perf_counter() - started
    flat: list[Generation] = [g for gs in gens for g in gs]
    rewards = verify_responses(name, [g.text for g in flat],
                               [r.answer for r in recs for _ in range(s.k)], timeout,
                               grader, truncated=[g.truncated for g in flat],
                               cut_off=cut_off)
    classes = vote_classes(name, rewards, s.k, timeout)
    rows = sample_rows(recs, plan.prompts[name], gens, rewards, classes)
    metrics = benchmark_metrics(rows, k=s.k)
    metrics["generation_seconds"] = round(seconds, 3)
    metrics["long_prompts"] = plan.long_report[name]
    return rows, metrics


def _run_config(plan: _EvalPlan, backend: _Backend, *, seed, limit, grader, cut_off,
                long_prompts, config, timeouts: int) -> dict:
    """The results' ``config``: the settings every benchmark ran with."""
    sampling = plan.sampling
    first = next(iter(sampling.values()))
    return {"k": {n: s.k for n, s in sampling.items()},
            "temperature": {n: s.effective_temperature for n, s in sampling.items()},
            "top_p": first.top_p, "max_new_tokens": first.max_new_tokens,
            "template": plan.template, "seed": seed, "limit": limit, "backend": backend.name,
            "backend_arguments": {n: backend.arguments(s) for n, s in sampling.items()},
            "gpqa_shuffle_seed": choice.GPQA_SHUFFLE_SEED,
            "template_source": plan.choice.template_source,
            "max_new_tokens_source": plan.choice.max_new_tokens_source,
            "verifier_timeouts": timeouts,
            "grader": grader, "cut_off_answers": cut_off,
            "long_prompts": long_prompts, **backend.settings,
            **dict(config or {})}


def _write_outputs(out_dir: Path, results: dict, samples: dict[str, list[dict]]) -> None:
    """Write ``samples_<bench>.jsonl`` then ``results.json`` (a ``results.json`` is only
    ever next to its complete samples)."""
    (out_dir / "results.json").unlink(missing_ok=True)
    for name, rows in samples.items():
        write_samples(out_dir / f"samples_{name}.jsonl", rows)
    write_results(out_dir / "results.json", results)
