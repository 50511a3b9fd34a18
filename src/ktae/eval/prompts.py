"""Evaluation prompts.

Templates:

* ``compact``: ``"Q:<problem> A:"``, the embedded default model's format, no chat template.
* ``qwen-math``: the Qwen-Math user message, ``"<problem>\\n" + QWEN_MATH_INSTRUCTION``,
  as plain text (for ``embedded`` records, ``"Compute <question>.\\n" + instruction``,
  exactly what :func:`ktae.tasks.embedded.format_prompt` gives the trainer).
* ``chat``: the ``qwen-math`` message as the user turn of the tokenizer's chat template,
  with the generation prompt appended.
* ``qwen-math-system``: a ChatML prompt with the Qwen-Math instruction as the *system*
  message and the bare problem as the user message (for ``embedded`` records,
  ``"Compute <question>."``), written out literally as the KTAE authors' evaluation
  script builds it (its ``qwen_math`` template, used by their ``our`` setting), whatever
  the tokenizer:
  ``<|im_start|>system\\n{instruction}<|im_end|>\\n<|im_start|>user\\n{problem}<|im_end|>\\n``
  ``<|im_start|>assistant\\n``. It is also Qwen2.5-Math's own evaluation template
  ``qwen25-math-cot``.
* ``auto`` (default): ``chat`` when the tokenizer has a chat template, else ``qwen-math``.
"""

from __future__ import annotations

from ktae.eval.benchmarks import BenchmarkRecord

TEMPLATES = ("auto", "compact", "qwen-math", "chat", "qwen-math-system")
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


def qwen_math_system_prompt(problem: str) -> str:
    """The ``qwen-math-system`` prompt of a bare problem text."""
    return (f"<|im_start|>system\n{QWEN_MATH_INSTRUCTION}<|im_end|>\n"
            f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")


def _message(record: BenchmarkRecord, template: str) -> str:
    if template == "qwen-math-system":
        bare = f"Compute {record.problem}." if record.source == "embedded" else record.problem
        return qwen_math_system_prompt(bare)
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
    if template not in ("compact", "qwen-math", "qwen-math-system"):
        raise ValueError(f"template: expected 'compact', 'qwen-math', 'qwen-math-system' or "
                         f"'chat', got {template!r}")
    return _message(record, template)
