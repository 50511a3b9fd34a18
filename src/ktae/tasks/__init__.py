"""Tasks: problem generators with exact answers (the embedded arithmetic task)."""

from ktae.tasks.embedded import (
    TEMPLATES,
    Problem,
    answer_for,
    format_prompt,
    generate,
    has_carry_or_borrow,
    solution_steps,
    split_of,
    worked_solution,
)

__all__ = [
    "TEMPLATES",
    "Problem",
    "answer_for",
    "format_prompt",
    "generate",
    "has_carry_or_borrow",
    "solution_steps",
    "split_of",
    "worked_solution",
]
