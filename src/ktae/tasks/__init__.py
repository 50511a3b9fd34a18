"""Tasks: problem generators with exact answers (the embedded arithmetic task)."""

from ktae.tasks.embedded import (
    LABEL_OTHER,
    LABEL_RIGHT,
    LABEL_WRONG,
    TEMPLATES,
    Problem,
    answer_for,
    format_prompt,
    generate,
    has_carry_or_borrow,
    label_response,
    level_of,
    question_of,
    solution_steps,
    split_of,
    token_labels,
    worked_solution,
)

__all__ = [
    "TEMPLATES",
    "Problem",
    "answer_for",
    "format_prompt",
    "generate",
    "LABEL_OTHER",
    "LABEL_RIGHT",
    "LABEL_WRONG",
    "has_carry_or_borrow",
    "label_response",
    "level_of",
    "question_of",
    "solution_steps",
    "split_of",
    "token_labels",
    "worked_solution",
]
