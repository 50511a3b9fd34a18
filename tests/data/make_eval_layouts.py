"""Writes the shipped evaluation-layout fixtures (problems written for ktae, in each
layout's schema): ``src/ktae/eval/fixtures/ktae_suite`` (a DatasetDict saved with
``save_to_disk``, the KTAE / Oat-Zero ``evaluation_suite`` layout: splits aime, amc, math,
minerva, olympiad_bench; columns problem, answer) and
``src/ktae/eval/fixtures/qwen_math/<name>/test.jsonl`` (the Qwen2.5-Math layout).

Run from the repository root: ``python tests/data/make_eval_layouts.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "ktae" / "eval" / "fixtures"

# answers as the suite stores them: strings (aime, math, minerva), floats (amc), lists of
# strings with trailing newlines (olympiad_bench)
SUITE = {
    "aime": [
        {"problem": "Find the remainder when $7^{2024}$ is divided by $1000$.", "answer": "801"},
        {"problem": "How many positive divisors does $2^{4}\\cdot 3^{3}$ have?", "answer": "20"},
        {"problem": "Find the number of ordered pairs $(a,b)$ of positive integers with "
                    "$a+b=50$ and $a<b$.", "answer": "024"},
    ],
    "amc": [
        {"problem": "What is $\\frac{1}{2}+\\frac{1}{4}+\\frac{1}{8}$ written as a decimal?",
         "answer": 0.875},
        {"problem": "A square has perimeter $36$. What is its area?", "answer": 81.0},
        {"problem": "What is the sum of the interior angles of a hexagon, in degrees?",
         "answer": 720.0},
    ],
    "math": [
        {"problem": "Simplify $\\sqrt{50}$.", "answer": "5\\sqrt{2}"},
        {"problem": "Solve for $x$: $3x-7=11$.", "answer": "6"},
        {"problem": "What is $\\dbinom{6}{2}$?", "answer": "15"},
    ],
    "minerva": [
        {"problem": "A car travels $150$ km in $2.5$ hours. What is its average speed in km/h?",
         "answer": "60"},
        {"problem": "Compute the kinetic energy in joules of a $2$ kg mass moving at $3$ m/s.",
         "answer": "9"},
        {"problem": "A wave has frequency $5$ Hz and wavelength $4$ m. Find its speed in m/s.",
         "answer": "20"},
    ],
    "olympiad_bench": [
        {"problem": "Find all real $x$ with $x^2=4x$.", "answer": ["0, 4\n"]},
        {"problem": "Find the smallest prime greater than $90$.", "answer": ["97\n"]},
        {"problem": "Compute $1+2+\\cdots+20$.", "answer": ["210\n"]},
    ],
}

QWEN = {  # Qwen2.5-Math data/<name>/test.jsonl; minerva_math rows are problem/solution only
    "minerva_math": [
        {"problem": "A car travels $150$ km in $2.5$ hours. What is its average speed in km/h?",
         "solution": "Speed is distance over time: $150/2.5=60$. The answer is $\\boxed{60}$.",
         "type": "Introduction to Astronomy (8.282J Spring 2006)", "idx": 0},
        {"problem": "Compute the kinetic energy in joules of a $2$ kg mass moving at $3$ m/s.",
         "solution": "$E=\\frac{1}{2}mv^2=\\frac{1}{2}\\cdot 2\\cdot 9=\\boxed{9}$.",
         "type": "Physics", "idx": 1},
        {"problem": "A wave has frequency $5$ Hz and wavelength $4$ m. Find its speed in m/s.",
         "solution": "First $v=f\\lambda$ gives $\\boxed{5\\cdot 4}$, so $v=\\boxed{20}$.",
         "type": "Physics", "idx": 2},
    ],
    "aime24": [
        {"id": 60, "problem": "Find the remainder when $7^{2024}$ is divided by $1000$.",
         "solution": "Work modulo $8$ and $125$ ... so the remainder is $\\boxed{801}$.",
         "answer": "801", "url": "", "year": "2024"},
        {"id": 61, "problem": "How many positive divisors does $2^{4}\\cdot 3^{3}$ have?",
         "solution": "$(4+1)(3+1)=20$.", "answer": "20", "url": "", "year": "2024"},
    ],
    "amc23": [
        {"id": 0, "question": "A square has perimeter $36$. What is its area?", "answer": 81.0,
         "url": ""},
        {"id": 1, "question": "What is the sum of the interior angles of a hexagon, in degrees?",
         "answer": 720.0, "url": ""},
    ],
}


def main() -> None:
    import datasets

    suite = ROOT / "ktae_suite"
    if suite.exists():
        shutil.rmtree(suite)
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows)
                          for name, rows in SUITE.items()}).save_to_disk(str(suite))
    for name, rows in QWEN.items():
        folder = ROOT / "qwen_math" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
