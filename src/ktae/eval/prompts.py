"""Evaluation prompts.

Templates:

* ``compact``: ``"Q:<problem> A:"``, the embedded default model's format, no chat template.
* ``qwen-math``: the Qwen-Math user message, ``"<problem>\\n" + QWEN_MATH_INSTRUCTION``,
  as plain text (for ``embedded`` records, ``"Compute <question>.\\n" + instruction``,
  exactly what :func:`ktae.tasks.embedded.format_prompt` gives the trainer).
* ``chat``: the ``qwen-math`` message as the user turn of the tokenizer's chat template,
  with the generation prompt appended.
* ``auto`` (default): ``chat`` when the tokenizer has a chat template, else ``qwen-math``.
"""

from __future__ import annotations

from ktae.eval.benchmarks import BenchmarkRecord

TEMPLATES = ("auto", "compact", "qwen-math", "chat")
QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def resolve_template(template: str, tokenizer) -> str:
    """The concrete template (``auto`` decided by the tokenizer)."""
    if template not in TEMPLATES:
        raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        return "chat" if has_chat else "qwen-math"
    if template == "chat" and not has_chat:
        raise ValueError("template: 'chat' needs a tokenizer with a chat template; "
                         "use 'qwen-math' or 'compact'")
    return template


def _message(record: BenchmarkRecord, template: str) -> str:
    if record.source == "embedded":
        from ktae.tasks.embedded import format_prompt

        return format_prompt(record.problem, template)
    if template == "compact":
        return f"Q:{record.problem} A:"
    return f"{record.problem}\n{QWEN_MATH_INSTRUCTION}"


def build_prompt(record: BenchmarkRecord, template: str, tokenizer=None) -> str:
    """The prompt text for ``record`` under a resolved template (see module docstring)."""
    if template == "chat":
        if tokenizer is None:
            raise ValueError("tokenizer: required by the 'chat' template")
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": _message(record, "qwen-math")}],
            tokenize=False, add_generation_prompt=True)
    if template not in ("compact", "qwen-math"):
        raise ValueError(f"template: expected 'compact', 'qwen-math' or 'chat', got {template!r}")
    return _message(record, template)
