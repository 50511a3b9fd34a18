"""Compare the claim labeller with its second implementation on sampled responses.

Runs :func:`ktae.tasks.claims.find_claims` and the independent reference
(``tests/claims_reference.py``, written from ``docs/claims.md`` alone) on every response of
a JSONL (optionally gzipped) of ``{"response": ..., "answer": ...}`` records, matches their
claims by labelled span, and prints: the claims each finds, how many both find with the
same verdict, how many both find with different verdicts, and the claims one finds and
the other skips (each listed with its line, with ``--list``).

    python studies/claims/claims_disagreements.py tests/data/smollm2_arithmetic_samples.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from claims_reference import reference_claims  # noqa: E402

from ktae.tasks.claims import find_claims  # noqa: E402


def claim_sets(text: str, answer) -> tuple[dict, dict]:
    """{(kind, labelled spans): verdict} of the module and of the reference."""
    module = {(c.kind, c.labelled): c.correct for c in find_claims(text, answer)}
    reference = {(kind, spans): ok for kind, spans, ok in reference_claims(text, answer)}
    return module, reference


def compare(records: list[dict]) -> tuple[dict[str, int], list[str]]:
    """The counts of docs/claims.md (Checks) and one line per difference."""
    counts = dict.fromkeys(["responses", "module", "reference", "agree", "verdict differs",
                            "module only", "reference only"], 0)
    notes = []
    for rec in records:
        text, answer = rec["response"], rec["answer"]
        module, reference = claim_sets(text, answer)
        counts["responses"] += 1
        counts["module"] += len(module)
        counts["reference"] += len(reference)
        for key in module.keys() | reference.keys():
            where = key[1][0][0]
            line_start = text.rfind("\n", 0, where) + 1
            line_end = text.find("\n", where)
            line = text[line_start:None if line_end < 0 else line_end]
            if key in module and key in reference:
                same = module[key] == reference[key]
                counts["agree" if same else "verdict differs"] += 1
                if not same:
                    notes.append(f"verdict differs  {rec.get('id')}: {line!r}")
            else:
                side = "module only" if key in module else "reference only"
                counts[side] += 1
                notes.append(f"{side:16} {rec.get('id')}: {line!r}")
    return counts, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="JSONL or JSONL.gz of {response, answer} records")
    parser.add_argument("--list", action="store_true", help="print every difference")
    args = parser.parse_args()
    opener = gzip.open if args.path.endswith(".gz") else open
    with opener(args.path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    counts, notes = compare(records)
    if args.list:
        print("\n".join(notes))
    width = max(len(k) for k in counts)
    for key, value in counts.items():
        print(f"{key:{width}}  {value}")


if __name__ == "__main__":
    main()
