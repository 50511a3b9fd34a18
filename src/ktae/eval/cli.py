"""``ktae eval MODEL --benchmarks math500,aime24,...``: benchmark a model (docs/method.md §13).

Writes ``results.json`` and ``samples_<bench>.jsonl`` to ``--output-dir`` and prints a
table. ``--protocol ktae|taco`` sets a paper's template, decoding, budget and k per
benchmark (:mod:`ktae.eval.protocols`); ``--checkpoints all`` evaluates every checkpoint
of a ``ktae train`` run directory (:mod:`ktae.eval.sweep`). Uses vLLM when it is
installed and a GPU is present (``--backend auto``), transformers otherwise (on a CPU
with vLLM's CPU build installed, one line says why; ``--backend vllm`` uses it:
docs/vllm.md). A model saved with ``ktae_generation.json`` (``ktae train``'s
models, the shipped default model) is prompted and budgeted as it was trained unless
``--template`` / ``--max-new-tokens`` say otherwise; the choice is printed.

Everything that can be checked is checked before the model loads (MODEL, the output
directory, the benchmark files, the decoding options); each problem is one error line
and exit status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ktae.eval import runner  # runner.evaluate read at call time: tests stand in for it
from ktae.eval.benchmarks import BENCHMARK_NAMES, saved_benchmarks
from ktae.eval.cache import (
    cache_key,
    cached_results,
    check_replace,
    default_output_dir,
    model_identity,
    read_results,
)
from ktae.eval.choice import CHOICE_BENCHMARKS
from ktae.eval.graders import GRADERS
from ktae.eval.multirun import aggregate, expand_models, summary_markdown, unique_labels
from ktae.eval.prompts import TEMPLATES
from ktae.eval.protocols import PROTOCOLS, get_protocol, resolve_settings
from ktae.eval.provenance import data_origin, records_sha256
from ktae.eval.responses import grade_responses, read_responses
from ktae.eval.results import (
    prepare_output_dir,
    results_table,
    unformatted_notice,
    write_results,
    write_samples,
)
from ktae.eval.sweep import AVG, incomplete_checkpoints, run_checkpoints, sweep
from ktae.eval.vllm_engine import expected_settings, prepare_environment
from ktae.models.generate import SamplingConfig, vllm_available
from ktae.models.generation_defaults import GENERATION_FILE, resolve_generation
from ktae.models.model_path import resolve_model_path
from ktae.rewards.ends import CUT_OFF_RULES, DEFAULT_CUT_OFF

ALL_NAMES = (*BENCHMARK_NAMES, *CHOICE_BENCHMARKS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``ktae eval``, in the order ``--help`` lists them."""
    _add_input_arguments(parser)
    _add_sampling_arguments(parser)
    _add_run_arguments(parser)
    _add_source_arguments(parser)


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """What is evaluated and how it is graded: the model(s), benchmarks, protocol, cut-off
    rule, grader, or responses already generated."""
    parser.add_argument("model", metavar="MODEL", nargs="*", default=None,
                        help="model directory or hub id (with --checkpoints: a ktae train "
                             "run directory; none with --responses); several, or a ktae "
                             "compare directory: each evaluated, then the mean and std over "
                             "runs (summary.md, summary.json)")
    parser.add_argument("--benchmarks", default=None,
                        help=f"comma-separated names among {', '.join(ALL_NAMES)} "
                             "(default: embedded; with a --data-dir saved by save_to_disk as a "
                             "DatasetDict, every split)")
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default=None,
                        help="a paper's evaluation: ktae (Qwen-Math system prompt, greedy, "
                             "3000 new tokens, k=1) or taco (temperature 0.7, top-p 0.9, "
                             "16384 new tokens, avg@32/4/16 per benchmark); explicit "
                             "flags override it")
    parser.add_argument("--cut-off-answers", choices=CUT_OFF_RULES, default=DEFAULT_CUT_OFF,
                        help="a response cut at --max-new-tokens without ending (or recorded "
                             "as truncated with --responses): wrong (default) or read "
                             "(scored from its text)")
    parser.add_argument("--grader", choices=tuple(GRADERS), default=None,
                        help="math grader: default (ktae's verifier), ktae-authors (the KTAE "
                             "authors' evaluation grader) or taco (normalised exact match or "
                             "numerical equality); default: the protocol's, else default")
    parser.add_argument("--responses", default=None, metavar="FILE",
                        help="grade responses already generated, without a model: a ktae "
                             "samples_*.jsonl (or an output directory of them), or JSON/JSONL "
                             "records with a benchmark, a reference and a response (the KTAE "
                             "authors' eval_result files)")


def _add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding flags: samples per problem, temperature, top-p, budget, template."""
    parser.add_argument("--k", default=None,
                        help="samples per problem: an integer for every benchmark, or "
                             "name=k entries (aime24=32,math500=4; a bare integer among "
                             "them covers the rest). 1 = pass@1, >1 = avg@k sampling "
                             "(default: the protocol's, else 1)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default: the protocol's, else 0 for "
                             "k=1 and 0.6 for k>1)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="nucleus sampling mass (default: the protocol's, else 1)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="response length budget in tokens (default: the protocol's, "
                             f"else the model's {GENERATION_FILE}, else 1024)")
    parser.add_argument("--template", choices=TEMPLATES, default=None,
                        help="prompt template (default: the protocol's, else the model's "
                             f"{GENERATION_FILE}, else auto: chat template if the tokenizer "
                             "has one, else qwen-math)")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Where results go and how the run is carried out (long prompts, threads, limit, batch
    size, seed)."""
    parser.add_argument("-o", "--output-dir", default=None,
                        help="where results.json and samples_*.jsonl go (default: "
                             "eval-results/<parent>-<name>-<hash of the model's absolute "
                             "path>, or eval-results/<owner>--<name> for a hub id)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results of another model found in --output-dir "
                             "(refused otherwise)")
    parser.add_argument("--long-prompts", choices=("error", "skip", "truncate"),
                        default="error",
                        help="prompts longer than the model's context: error (default: "
                             "refuse, naming the benchmark, the count and the longest), "
                             "skip them, or truncate them (cut from the left); the count is "
                             "recorded per benchmark")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N problems of each benchmark (embedded: generate N)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the problems come from, the engine that generates, and --checkpoints."""
    parser.add_argument("--data-dir", default=None,
                        help="read <name>.jsonl/.json/.parquet or <name>/test.jsonl (Qwen2.5-Math "
                             "layout) from this directory, or the splits of a Dataset/DatasetDict "
                             "saved there with save_to_disk (the KTAE evaluation suite), instead "
                             "of the hub")
    parser.add_argument("--fixtures", action="store_true",
                        help="use the few sample records shipped with ktae (offline smoke test)")
    parser.add_argument("--split", default=None, help="dataset split (default: each benchmark's)")
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                        help="generation engine (auto: vLLM if installed and a GPU is present; "
                             "vllm also runs vLLM's CPU build, see docs/vllm.md)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                        default="auto",
                        help="model weights dtype (vLLM's auto turns a float32 model into "
                             "bfloat16 on a CPU; the dtype it ran in is recorded)")
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM's start-up log (quiet otherwise)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="verifier time limit per answer, seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--checkpoints", default=None, metavar="all|STEPS",
                        help="MODEL is a run directory: evaluate each complete checkpoint-N "
                             "('all', or steps such as 2,4) once (results cached per "
                             "checkpoint), draw the curves and name the best")
    parser.add_argument("--select-on", default=None, metavar="BENCH",
                        help="with --checkpoints: the validation benchmark whose accuracy "
                             "picks the best checkpoint (default: the mean over benchmarks)")

def _benchmark_names(spec: str | None, data_dir) -> list[str]:
    """The names of ``--benchmarks`` (default: every split of a DatasetDict saved as
    ``data_dir``, else ``embedded``). A split of that DatasetDict named by its own name
    (``amc``) becomes the name it is reported under (``amc22-23``), so the protocols' k
    and the results use one name."""
    saved = saved_benchmarks(data_dir) if data_dir is not None else None
    if spec is None and data_dir is not None and not saved:
        what = ("is empty" if Path(data_dir).is_dir() and not any(Path(data_dir).iterdir())
                else "is not a dataset saved with save_to_disk" if Path(data_dir).is_dir()
                else "is not a directory")
        raise ValueError(f"--data-dir: {data_dir} {what}; name the benchmarks to read from "
                         "it with --benchmarks")
    if spec is None:
        spec = ",".join(saved) if saved else "embedded"
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError("--benchmarks: expected at least one name")
    if saved:
        reported = {split: name for name, split in saved.items()}
        names = list(dict.fromkeys(reported.get(n, n) for n in names))
    unknown = [n for n in names if n not in ALL_NAMES]
    if unknown and data_dir is None:
        raise ValueError(f"--benchmarks: unknown benchmark {unknown[0]!r}; expected names "
                         f"among {', '.join(ALL_NAMES)} (any name reads <name>.jsonl "
                         "with --data-dir)")
    return names


def run(args: argparse.Namespace) -> int:
    """Evaluate; bad arguments or data print one error line and return 2."""
    from rich.console import Console
    from rich.markup import escape

    try:
        return _run(args, Console())
    except ValueError as e:
        Console(stderr=True).print(f"[red]ktae eval:[/red] {escape(str(e))}",
                                   markup=True, highlight=False, soft_wrap=True)
        return 2


def _check_options(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: expected a positive integer, got {args.batch_size}")
    if args.threads < 1:
        raise ValueError(f"--threads: expected a positive integer, got {args.threads}")
    if not (0 < args.timeout < float("inf")):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    if args.select_on is not None and args.checkpoints is None:
        raise ValueError("--select-on: only with --checkpoints")
    if args.backend == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError("--backend vllm: vLLM is not installed (pip install 'ktae[vllm]' "
                             "for its CPU build, see docs/vllm.md); --backend hf runs anywhere")


def _settings(args: argparse.Namespace, names: list[str], model_path: str):
    """The protocol and flags resolved, the template and budget chosen, and every
    benchmark's sampling validated (errors name the flag)."""
    from dataclasses import replace

    settings = resolve_settings(names, protocol=args.protocol, template=args.template,
                                temperature=args.temperature, top_p=args.top_p,
                                max_new_tokens=args.max_new_tokens, k=args.k,
                                grader=args.grader)
    choice = resolve_generation(model_path, template=settings.template,
                                max_new_tokens=settings.max_new_tokens)
    for field in ("template", "max_new_tokens"):
        src = settings.sources[field]
        if src and src != "given":
            choice = replace(choice, **{f"{field}_source": src})
    for name, k in settings.k.items():
        try:
            SamplingConfig(k=k, temperature=settings.temperature, top_p=settings.top_p,
                           max_new_tokens=choice.max_new_tokens, seed=args.seed)
        except ValueError as e:
            raise ValueError(f"{e} (benchmark {name}, k={k})") from None
    return settings, choice


def _settings_record(settings, names: list[str], args) -> dict:
    return {"benchmarks": names, "limit": args.limit,
            "protocol": settings.protocol.as_dict() if settings.protocol else None,
            "settings_sources": dict(settings.sources)}


def _settings_key(args, settings, choice, names: list[str], backend: str,
                  engine: dict | None = None) -> dict:
    """Every setting that changes the samples or their grading (the data is keyed by its
    content, :func:`ktae.eval.provenance.records_sha256`); with vLLM, ``engine``: its
    version and the dtype it will run in (:func:`ktae.eval.vllm_engine.expected_settings`)."""
    return {**({"engine": engine} if engine else {}),
            "benchmarks": names, "k": settings.k, "temperature": settings.temperature,
            "top_p": settings.top_p, "max_new_tokens": choice.max_new_tokens,
            "template": choice.template, "seed": args.seed, "limit": args.limit,
            "backend": backend, "dtype": args.dtype, "split": args.split,
            "timeout": args.timeout, "long_prompts": args.long_prompts,
            "cut_off_answers": args.cut_off_answers,
            "grader": settings.grader}


def _data(records, names: list[str], args) -> tuple[dict, dict]:
    """Each benchmark's origin (results.json ``data``) and the sha256 of its problems."""
    origins = {n: data_origin(n, data_dir=args.data_dir, fixtures=args.fixtures,
                              split=args.split) for n in names}
    return origins, {n: records_sha256(r) for n, r in records.items()}


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _run(args: argparse.Namespace, console) -> int:
    args.model = _one_or_many(args.model)
    if args.responses is not None:
        return _run_responses(args, console)
    if args.model is None:
        raise ValueError("MODEL: expected a model directory or hub id (or --responses FILE)")
    names = _benchmark_names(args.benchmarks, args.data_dir)
    _check_options(args)
    if args.checkpoints is not None:
        if isinstance(args.model, list):
            raise ValueError("--checkpoints: expected one run directory as MODEL")
        return _run_checkpoints(args, console, names)

    models = expand_models([args.model] if isinstance(args.model, str) else args.model)
    if len(models) > 1 or isinstance(args.model, list):
        return _run_many(args, console, models)
    model_path = resolve_model_path(args.model)
    settings, choice = _settings(args, names, model_path)
    output_dir = prepare_output_dir(
        args.output_dir or default_output_dir(args.model), "--output-dir")
    records = runner.load_records(names, limit=args.limit, data_dir=args.data_dir,
                           fixtures=args.fixtures, split=args.split,
                           hub_sources=_hub_sources(args))
    backend = _backend(args, console)
    origins, hashes = _data(records, names, args)
    settings_key = _settings_key(args, settings, choice, names, backend,
                                 _engine(args, backend, model_path))

    def key_now() -> dict:
        return cache_key(model=args.model, model_dir=resolve_model_path(args.model),
                         data=hashes, settings=settings_key)

    key = key_now()
    check_replace(output_dir, key, overwrite=args.overwrite)
    cached = None if args.overwrite else cached_results(output_dir, key, names)
    if cached is not None:
        console.print(f"cached: {output_dir / 'results.json'} holds this evaluation (same "
                      "model, weights, data and settings)", markup=False, highlight=False,
                      soft_wrap=True)
        _print_results(console, cached)
        return 0
    _set_threads(args.threads)
    tokenizer, model = _load(model_path, args.model, backend, args.dtype)
    _print(console, settings, choice)
    results = runner.evaluate(
        model, tokenizer, records, k=settings.k, temperature=settings.temperature,
        top_p=settings.top_p, max_new_tokens=choice.max_new_tokens, template=choice.template,
        batch_size=args.batch_size, seed=args.seed, output_dir=output_dir,
        timeout=args.timeout, show_progress=not args.no_progress, backend=backend,
        model_path=model_path, dtype=args.dtype, grader=settings.grader,
        cut_off=args.cut_off_answers,
        long_prompts=args.long_prompts, data=origins, verbose=args.verbose,
        config={"model": args.model, **_settings_record(settings, names, args),
                "template_source": choice.template_source,
                "max_new_tokens_source": choice.max_new_tokens_source,
                "cache_key": key_now()})  # a hub model is in the local cache by now
    _print_results(console, results)
    console.print(f"wrote {output_dir / 'results.json'}")
    return 0


def _one_or_many(model):
    """MODEL arguments: None, one model (a string), or several (a list)."""
    if isinstance(model, list):
        return None if not model else model[0] if len(model) == 1 else model
    return model


def _run_many(args: argparse.Namespace, console, models: list[str]) -> int:
    """Several runs (or a ``ktae compare`` directory): each evaluated into
    ``<output-dir>/<run>/``, then the mean and std over runs (:mod:`ktae.eval.multirun`)."""
    import copy
    import hashlib
    import json

    if args.output_dir is None:
        if isinstance(args.model, str):  # one ktae compare directory
            args.output_dir = str(default_output_dir(args.model))
        else:
            ident = "\n".join(sorted(model_identity(m) for m in models))
            args.output_dir = str(Path("eval-results")
                                  / f"runs-{hashlib.sha256(ident.encode()).hexdigest()[:6]}")
    output_dir = prepare_output_dir(args.output_dir, "--output-dir")
    results = {}
    for label, model in zip(unique_labels(models), models, strict=True):
        console.print(f"{label}: {model}", markup=False, highlight=False, soft_wrap=True)
        one = copy.copy(args)
        one.model, one.output_dir = model, str(output_dir / label)
        _run(one, console)
        results[label] = read_results(output_dir / label)
    summary = aggregate(results)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n",
                                             encoding="utf-8")
    markdown = summary_markdown(summary)
    (output_dir / "summary.md").write_text(markdown, encoding="utf-8")
    console.print(markdown, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {output_dir / 'summary.md'} and {output_dir / 'summary.json'}",
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def _run_responses(args: argparse.Namespace, console) -> int:
    """``--responses``: grade a file of generated responses with the grader (given, or
    the protocol's) and print the table; no model is loaded."""
    if args.model is not None:
        raise ValueError("--responses: grades a file without a model; drop MODEL")
    if not (0 < args.timeout < float("inf")):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    protocol = get_protocol(args.protocol) if args.protocol else None
    grader = args.grader or (protocol.grader if protocol else "default")
    problems = read_responses(args.responses)
    if args.benchmarks is not None:
        wanted = [n.strip() for n in args.benchmarks.split(",") if n.strip()]
        missing = [n for n in wanted if n not in problems]
        if missing:
            raise ValueError(f"--benchmarks: {', '.join(missing)} not in {args.responses} "
                             f"(it holds {', '.join(problems)})")
        problems = {n: problems[n] for n in wanted}
    if args.limit is not None:
        problems = {n: p[:args.limit] for n, p in problems.items()}
    output_dir = prepare_output_dir(
        args.output_dir or Path("eval-results") / f"{Path(args.responses).stem}-{grader}",
        "--output-dir")
    console.print(f"grading {args.responses} with grader {grader}", markup=False,
                  highlight=False, soft_wrap=True)
    results = grade_responses(problems, grader=grader, timeout=args.timeout,
                              cut_off=args.cut_off_answers,
                              config={"responses": str(args.responses),
                                      "protocol": args.protocol, "limit": args.limit})
    samples = results.pop("samples")
    write_results(output_dir / "results.json", results)
    source = Path(args.responses)
    if (source if source.is_dir() else source.parent).resolve() != output_dir.resolve():
        for name, rows in samples.items():  # graded rows, beside results.json
            write_samples(output_dir / f"samples_{name}.jsonl", rows)
    _print_results(console, results)
    console.print(f"wrote {output_dir / 'results.json'}")
    return 0


def _hub_sources(args) -> dict | None:
    """The protocol's own hub datasets (TACO's AIME sets), for benchmarks read from the hub."""
    return dict(get_protocol(args.protocol).hub_sources) if args.protocol else None


def _print_results(console, results) -> None:
    """The results table, then a one-line notice when no response was formatted."""
    console.print(results_table(results))
    notice = unformatted_notice(results)
    if notice is not None:
        console.print(f"note: {notice}", markup=False, highlight=False, soft_wrap=True)


def _print(console, settings, choice) -> None:
    for line in (settings.describe(), f"generation: {choice.describe()}"):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _run_checkpoints(args: argparse.Namespace, console, names: list[str]) -> int:
    """``--checkpoints``: everything checked first, then one evaluation per checkpoint
    not already cached (see :mod:`ktae.eval.sweep`)."""
    checkpoints = run_checkpoints(args.model, args.checkpoints)
    incomplete = incomplete_checkpoints(args.model)
    if incomplete:
        console.print(f"skipped {', '.join(incomplete)}: incomplete (no weights or no "
                      "completion marker)", markup=False, highlight=False, soft_wrap=True)
    select_on = args.select_on or AVG
    if select_on != AVG and select_on not in names:
        raise ValueError(f"--select-on: {select_on} is not among --benchmarks "
                         f"({', '.join(names)})")
    plans = [(ck, *_settings(args, names, str(ck.path))) for ck in checkpoints]
    output_dir = prepare_output_dir(args.output_dir or default_output_dir(args.model),
                                    "--output-dir")
    records = runner.load_records(names, limit=args.limit, data_dir=args.data_dir,
                           fixtures=args.fixtures, split=args.split,
                           hub_sources=_hub_sources(args))
    backend = _backend(args, console)
    engine = _engine(args, backend, str(checkpoints[0].path)) if checkpoints else None
    by_label = {ck.label: (settings, choice) for ck, settings, choice in plans}
    keys = {_key_json(_settings_key(args, *v, names, backend)) for v in by_label.values()}
    if len(keys) != 1:
        raise ValueError("--checkpoints: the checkpoints were saved with different "
                         "templates or budgets; give --template and --max-new-tokens")
    settings_key = _settings_key(args, *next(iter(by_label.values())), names, backend, engine)
    origins, hashes = _data(records, names, args)

    def key_of(ck) -> dict:
        return cache_key(model=str(ck.path), model_dir=ck.path, data=hashes,
                         settings=settings_key,
                         checkpoint={"label": ck.label, "step": ck.step})

    for ck in checkpoints:
        check_replace(output_dir / ck.label, key_of(ck), overwrite=args.overwrite)
    _set_threads(args.threads)

    def evaluate_one(ck, out: Path) -> dict:
        settings, choice = by_label[ck.label]
        console.print(f"{ck.label}: evaluating", markup=False, highlight=False)
        _print(console, settings, choice)
        tokenizer, model = _load(str(ck.path), str(ck.path), backend, args.dtype)
        return runner.evaluate(
            model, tokenizer, records, k=settings.k, temperature=settings.temperature,
            top_p=settings.top_p, max_new_tokens=choice.max_new_tokens,
            template=choice.template, batch_size=args.batch_size, seed=args.seed,
            output_dir=out, timeout=args.timeout, show_progress=not args.no_progress,
            backend=backend, model_path=str(ck.path), dtype=args.dtype, grader=settings.grader,
            cut_off=args.cut_off_answers, long_prompts=args.long_prompts, data=origins, verbose=args.verbose,
            config={"model": str(ck.path), "checkpoint": ck.label, "step": ck.step,
                    **_settings_record(settings, names, args),
                    "template_source": choice.template_source,
                    "max_new_tokens_source": choice.max_new_tokens_source,
                    "cache_key": key_of(ck)})

    def report(ck, results, cached) -> None:
        if cached:
            console.print(f"{ck.label}: cached ({output_dir / ck.label / 'results.json'})",
                          markup=False, highlight=False, soft_wrap=True)
        _print_results(console, results)

    summary = sweep(checkpoints, output_dir, key_of, evaluate_one, benchmarks=names,
                    select_on=select_on, on_result=report)
    best = summary["best"]
    console.print(f"best checkpoint on {select_on}: {best['label']} (step {best['step']}, "
                  f"{100 * best['scores'][select_on]:.1f}%)", markup=False, highlight=False)
    console.print(f"wrote {output_dir / 'checkpoints.json'} and "
                  f"{output_dir / 'checkpoints.png'}", markup=False, highlight=False,
                  soft_wrap=True)
    return 0


def _backend(args, console) -> str:
    """``--backend``, with ``auto`` decided: vLLM with a GPU, else transformers (one line
    says why when vLLM is installed but there is no GPU)."""
    import importlib.util

    if args.backend != "auto":
        return args.backend
    if vllm_available():
        return "vllm"
    if importlib.util.find_spec("vllm") is not None:
        console.print(AUTO_ON_CPU, markup=False, highlight=False, soft_wrap=True)
    return "hf"


AUTO_ON_CPU = ("backend: transformers (auto keeps it on a CPU: vLLM's CPU build takes minutes "
               "to start and runs a float32 model in bfloat16 under --dtype auto; "
               "--backend vllm uses it)")


def _engine(args, backend: str, model_path: str) -> dict | None:
    """The vLLM engine's settings for the cache key (its environment set first)."""
    if backend != "vllm":
        return None
    from rich.console import Console

    def say(line: str) -> None:
        Console(stderr=True).print(line, markup=False, highlight=False, soft_wrap=True)

    prepare_environment(verbose=args.verbose, say=say)
    return expected_settings(model_path, requested_dtype=args.dtype, seed=args.seed)


def _key_json(key: dict) -> str:
    import json

    return json.dumps(key, sort_keys=True)


def _load(model_path: str, name: str, backend: str, dtype: str):
    """Tokenizer and (hf backend) model; a load failure is one error line naming MODEL."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar before our own lines
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if backend != "hf":
            return tokenizer, None
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"MODEL: cannot load {name}: {first}") from None
    if torch.cuda.is_available():
        model = model.to("cuda")
    return tokenizer, model
