"""``ktae eval MODEL --benchmarks math500,aime24,...``: benchmark a model (SPEC section 7).

Writes ``results.json`` and ``samples_<bench>.jsonl`` to ``--output-dir`` and prints a
table. Uses vLLM when it is installed and a GPU is present (``--backend auto``),
transformers otherwise. A model saved with ``ktae_generation.json`` (``ktae train``'s
models, the shipped default model) is prompted and budgeted as it was trained unless
``--template`` / ``--max-new-tokens`` say otherwise; the choice is printed.

Everything that can be checked is checked before the model loads (MODEL, the output
directory, the benchmark files, the decoding options); each problem is one error line
and exit status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ktae.eval.benchmarks import BENCHMARK_NAMES
from ktae.eval.defaults import GENERATION_FILE
from ktae.eval.prompts import TEMPLATES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="model directory or hub id")
    parser.add_argument("--benchmarks", default=None,
                        help=f"comma-separated names among {', '.join(BENCHMARK_NAMES)} "
                             "(default: embedded; with a --data-dir saved by save_to_disk as a "
                             "DatasetDict, every split)")
    parser.add_argument("--k", type=int, default=1,
                        help="samples per problem: 1 = greedy pass@1, >1 = avg@k sampling")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default 0 for k=1, 0.6 for k>1)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="response length budget in tokens (default: the model's "
                             f"{GENERATION_FILE}, else 1024)")
    parser.add_argument("--template", choices=TEMPLATES, default=None,
                        help=f"prompt template (default: the model's {GENERATION_FILE}, else "
                             "auto: chat template if the tokenizer has one, else qwen-math)")
    parser.add_argument("-o", "--output-dir", default=None,
                        help="where results.json and samples_*.jsonl go "
                             "(default: eval-results/<model name>)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N problems of each benchmark (embedded: generate N)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--data-dir", default=None,
                        help="read <name>.jsonl/.json/.parquet or <name>/test.jsonl (Qwen2.5-Math "
                             "layout) from this directory, or the splits of a Dataset/DatasetDict "
                             "saved there with save_to_disk (the KTAE evaluation suite), instead "
                             "of the hub")
    parser.add_argument("--fixtures", action="store_true",
                        help="use the few sample records shipped with ktae (offline smoke test)")
    parser.add_argument("--split", default=None, help="dataset split (default: each benchmark's)")
    parser.add_argument("--backend", choices=("auto", "hf", "vllm"), default="auto",
                        help="generation engine (auto: vLLM if installed and a GPU is present)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                        default="auto", help="model weights dtype")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="verifier time limit per answer, seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _benchmark_names(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ValueError("--benchmarks: expected at least one name")
    return names


def _default_benchmarks(data_dir) -> str:
    """Every split of a saved DatasetDict at ``data_dir`` (under its reported names), else
    ``embedded``."""
    from ktae.eval.benchmarks import saved_benchmarks

    saved = saved_benchmarks(data_dir) if data_dir is not None else None
    return ",".join(saved) if saved else "embedded"


def run(args: argparse.Namespace) -> int:
    """Evaluate; bad arguments or data print one error line and return 2."""
    from rich.console import Console
    from rich.markup import escape

    try:
        return _run(args, Console())
    except ValueError as e:
        Console(stderr=True).print(f"[red]ktae eval: error:[/red] {escape(str(e))}",
                                   markup=True, highlight=False, soft_wrap=True)
        return 2


def _check_options(args: argparse.Namespace) -> None:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size: expected a positive integer, got {args.batch_size}")
    if not (0 < args.timeout < float("inf")):
        raise ValueError(f"--timeout: expected a positive number of seconds, got {args.timeout}")


def _run(args: argparse.Namespace, console) -> int:
    from ktae.eval.defaults import resolve_generation
    from ktae.eval.generate import SamplingConfig, vllm_available
    from ktae.eval.model_path import resolve_model_path
    from ktae.eval.results import prepare_output_dir, results_table
    from ktae.eval.runner import evaluate, load_records

    names = _benchmark_names(args.benchmarks or _default_benchmarks(args.data_dir))
    _check_options(args)
    model_path = resolve_model_path(args.model)
    choice = resolve_generation(model_path, template=args.template,
                                max_new_tokens=args.max_new_tokens)
    SamplingConfig(k=args.k, temperature=args.temperature, top_p=args.top_p,
                   max_new_tokens=choice.max_new_tokens, seed=args.seed)  # validates
    output_dir = prepare_output_dir(
        args.output_dir or Path("eval-results") / Path(args.model).name, "--output-dir")
    records = load_records(names, limit=args.limit, data_dir=args.data_dir,
                           fixtures=args.fixtures, split=args.split)
    backend = args.backend
    if backend == "auto":
        backend = "vllm" if vllm_available() else "hf"
    tokenizer, model = _load(model_path, args.model, backend, args.dtype)
    console.print(f"generation: {choice.describe()}", markup=False, highlight=False,
                  soft_wrap=True)
    results = evaluate(
        model, tokenizer, records, k=args.k, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=choice.max_new_tokens, template=choice.template,
        batch_size=args.batch_size, seed=args.seed, output_dir=output_dir,
        timeout=args.timeout, show_progress=not args.no_progress, backend=backend,
        model_path=model_path,
        config={"model": args.model, "benchmarks": names, "limit": args.limit,
                "template_source": choice.template_source,
                "max_new_tokens_source": choice.max_new_tokens_source})
    console.print(results_table(results))
    console.print(f"wrote {output_dir / 'results.json'}")
    return 0


def _load(model_path: str, name: str, backend: str, dtype: str):
    """Tokenizer and (hf backend) model; a load failure is one error line naming MODEL."""
    from transformers import AutoTokenizer

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
