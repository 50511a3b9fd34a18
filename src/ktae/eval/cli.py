"""``ktae eval MODEL --benchmarks math500,aime24,...``: benchmark a model (SPEC section 7).

Writes ``results.json`` and ``samples_<bench>.jsonl`` to ``--output-dir`` and prints a
table. Uses vLLM when it is installed and a GPU is present (``--backend auto``),
transformers otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ktae.eval.benchmarks import BENCHMARK_NAMES
from ktae.eval.prompts import TEMPLATES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="model directory or hub id")
    parser.add_argument("--benchmarks", default="embedded",
                        help=f"comma-separated names among {', '.join(BENCHMARK_NAMES)} "
                             "(default: embedded)")
    parser.add_argument("--k", type=int, default=1,
                        help="samples per problem: 1 = greedy pass@1, >1 = avg@k sampling")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sampling temperature (default 0 for k=1, 0.6 for k>1)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--max-new-tokens", type=int, default=1024,
                        help="response length budget in tokens")
    parser.add_argument("--template", choices=TEMPLATES, default="auto",
                        help="prompt template (auto: chat template if the tokenizer has one, "
                             "else qwen-math)")
    parser.add_argument("--output-dir", default=None,
                        help="where results.json and samples_*.jsonl go "
                             "(default: eval-results/<model name>)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N problems of each benchmark (embedded: generate N)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--data-dir", default=None,
                        help="read <name>.jsonl/.json/.parquet (hub schema) from this directory "
                             "instead of the hub")
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


def run(args: argparse.Namespace) -> int:
    """Evaluate; bad arguments or data print one error line and return 2."""
    from rich.console import Console

    try:
        return _run(args, Console())
    except ValueError as e:
        Console(stderr=True).print(f"[red]ktae eval: error:[/red] {e}", markup=True,
                                   highlight=False)
        return 2


def _run(args: argparse.Namespace, console) -> int:

    from ktae.eval.generate import vllm_available
    from ktae.eval.results import results_table
    from ktae.eval.runner import evaluate, load_records

    names = _benchmark_names(args.benchmarks)
    records = load_records(names, limit=args.limit, data_dir=args.data_dir,
                           fixtures=args.fixtures, split=args.split)
    backend = args.backend
    if backend == "auto":
        backend = "vllm" if vllm_available() else "hf"
    output_dir = Path(args.output_dir or Path("eval-results") / Path(args.model).name)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = None
    if backend == "hf":
        import torch
        from transformers import AutoModelForCausalLM

        dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        if torch.cuda.is_available():
            model = model.to("cuda")
    results = evaluate(
        model, tokenizer, records, k=args.k, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, template=args.template,
        batch_size=args.batch_size, seed=args.seed, output_dir=output_dir,
        timeout=args.timeout, show_progress=not args.no_progress, backend=backend,
        model_path=args.model,
        config={"model": args.model, "benchmarks": names, "limit": args.limit})
    console.print(results_table(results))
    console.print(f"wrote {output_dir / 'results.json'}")
    return 0
