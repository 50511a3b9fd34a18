"""What reading cut-off responses as cut off changes, on sampled responses.

Reads a JSONL (optionally gzipped) of ``{"response", "answer", "response_ids"}`` records
written by ``studies/claims/sample_arithmetic_responses.py`` (which keeps the ids before the first
stop token), such as ``tests/data/smollm2_arithmetic_samples.jsonl.gz``. A response with
``--max-new-tokens`` ids never stopped: the budget cut it. For those responses it prints
the claims :func:`ktae.tasks.claims.find_claims` reads when the response is taken as
ended and when it is taken as cut off (docs/claims.md, Cut-off responses), false ones in
brackets, and the claims only the first reading makes (each with the response's last
characters, with ``--list``).

    python studies/claims/claims_cut_off.py tests/data/smollm2_arithmetic_samples.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json

from ktae.tasks.claims import find_claims


def _key(c) -> tuple:
    return c.kind, c.labelled, c.correct


def compare(records: list[dict], max_new_tokens: int) -> tuple[dict[str, int], list[str]]:
    """The counts printed by :func:`main` and one line per claim skipped as cut off."""
    counts = dict.fromkeys(["responses", "cut off", "claims as ended", "false as ended",
                            "claims as cut off", "false as cut off", "skipped",
                            "skipped false"], 0)
    notes = []
    for rec in records:
        counts["responses"] += 1
        if len(rec["response_ids"]) != max_new_tokens:
            continue
        counts["cut off"] += 1
        text, answer = rec["response"], rec["answer"]
        ended = find_claims(text, answer)
        cut = {_key(c) for c in find_claims(text, answer, cut_off=True)}
        counts["claims as ended"] += len(ended)
        counts["false as ended"] += sum(not c.correct for c in ended)
        counts["claims as cut off"] += len(cut)
        counts["false as cut off"] += sum(not ok for _, _, ok in cut)
        for c in ended:
            if _key(c) not in cut:
                counts["skipped"] += 1
                counts["skipped false"] += not c.correct
                notes.append(f"{rec.get('id')} {'false' if not c.correct else 'true'}: "
                             f"{text[max(0, c.start - 20):]!r}")
    return counts, notes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="JSONL (optionally .gz) of sampled responses")
    parser.add_argument("--max-new-tokens", type=int, default=96,
                        help="the sampling budget: a response with this many ids was cut")
    parser.add_argument("--list", action="store_true", help="print each skipped claim")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens: expected a positive integer, got {args.max_new_tokens}")
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(args.path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    counts, notes = compare(records, args.max_new_tokens)
    print(f"responses          {counts['responses']}")
    print(f"cut off            {counts['cut off']}")
    print(f"claims as ended    {counts['claims as ended']} ({counts['false as ended']} false)")
    print(f"claims as cut off  {counts['claims as cut off']} ({counts['false as cut off']} false)")
    print(f"skipped            {counts['skipped']} ({counts['skipped false']} false)")
    if args.list:
        for line in notes:
            print(line)


if __name__ == "__main__":
    main()
