"""Prompt templates, for evaluation and training alike (one place).

Templates:

* ``compact``: ``"Q:<problem> A:"``, the embedded default model's format, no chat template.
* ``qwen-math``: the Qwen-Math user message, ``"<problem>\\n" + QWEN_MATH_INSTRUCTION``,
  as plain text (for ``embedded`` records, ``"Compute <question>.\\n" + instruction``,
  exactly what :func:`ktae.tasks.embedded.format_prompt` gives the trainer).
* ``chat``: the tokenizer's chat template, with the generation prompt appended, over the
  row's own chat messages where it has them (verl's RL schema: DAPO-Math-17k and verl's
  preprocessed sets carry their instruction in them), else over the ``qwen-math``
  message as the user turn.
* ``qwen-math-system``: the KTAE authors' evaluation prompt (their ``eval/`` scripts,
  Oat-Zero's ``qwen_math`` template; also Qwen2.5-Math's ``qwen25-math-cot``): a ChatML
  prompt written out as text, with :data:`QWEN_MATH_INSTRUCTION` as the *system* message
  and the bare problem as the user message (``"Compute <question>."`` for ``embedded``
  records), whatever the tokenizer (Qwen tokenizers read the ChatML markers):
  ``<|im_start|>system\\n{instruction}<|im_end|>\\n<|im_start|>user\\n{problem}<|im_end|>\\n``
  ``<|im_start|>assistant\\n``.
* ``ktae-train``: the instruction verl's MATH preprocessing appends to a problem (the
  prompt of the MATH parquet files verl's examples build; the KTAE paper's own runs use
  ``qwen-math-system`` for training and validation, appendix J):
  ``"<problem> " + KTAE_TRAIN_INSTRUCTION`` as the user turn of the tokenizer's chat
  template.
* ``dapo``: DAPO-Math-17k's prompt (DAPO; TACO trains on that set), which asks for a final
  ``Answer: $Answer`` line (read by ``--reward dapo``): :data:`DAPO_PREFIX` + problem +
  :data:`DAPO_SUFFIX` as the user turn of the chat template; a problem that already holds
  that instruction (a DAPO-Math-17k row) is not wrapped twice.
* ``arith`` records (:mod:`ktae.tasks.arith`) carry the task's own instruction under
  every template: ``chat`` puts the question and :data:`ktae.tasks.arith.INSTRUCTION` in
  the user turn, as ``ktae train --task arith`` does.
* ``raw``: the problem text verbatim (for chat rows, their messages' contents joined by a
  blank line), no template: what the data file says, for models without a chat template.
* ``auto`` (evaluation default): ``chat`` when the tokenizer has a chat template, else
  ``qwen-math``.
"""

from __future__ import annotations

from ktae.eval.benchmarks import BenchmarkRecord
from ktae.tasks.arith import user_message
from ktae.tasks.embedded import format_prompt

TEMPLATES = ("auto", "compact", "qwen-math", "chat", "qwen-math-system", "ktae-train", "dapo",
             "raw")
"""Every template name (``auto`` is resolved by :func:`resolve_template`)."""

CHAT_TEMPLATES = ("chat", "ktae-train", "dapo")
"""Templates rendered through the tokenizer's chat template."""

QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
KTAE_TRAIN_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your response "
               "should be of the form Answer: $Answer (without quotes) where $Answer is the "
               "answer to the problem.\n\n")
DAPO_SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."


def resolve_template(template: str, tokenizer) -> str:
    """The concrete template (``auto`` decided by the tokenizer)."""
    if template not in TEMPLATES:
        raise ValueError(f"template: expected one of {TEMPLATES}, got {template!r}")
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        return "chat" if has_chat else "qwen-math"
    if template in CHAT_TEMPLATES and not has_chat:
        raise ValueError(f"template: {template!r} needs a tokenizer with a chat template; "
                         "use 'qwen-math', 'qwen-math-system', 'raw' or 'compact'")
    return template


def uses_chat_template(template: str) -> bool:
    """Whether prompts of ``template`` are already complete chat text (no special tokens
    to add when tokenizing)."""
    return template in (*CHAT_TEMPLATES, "qwen-math-system")


def qwen_math_system_prompt(problem: str) -> str:
    """The ``qwen-math-system`` prompt of a bare problem text."""
    return (f"<|im_start|>system\n{QWEN_MATH_INSTRUCTION}<|im_end|>\n"
            f"<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")


def _chat(tokenizer, messages: list) -> str:
    if tokenizer is None:
        raise ValueError("tokenizer: required by the chat templates")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _dapo_message(problem: str) -> str:
    if problem.startswith(DAPO_PREFIX) and problem.endswith(DAPO_SUFFIX):
        return problem
    return f"{DAPO_PREFIX}{problem}{DAPO_SUFFIX}"


def render_prompt(problem: str, template: str, tokenizer=None, *, messages: list | None = None
                  ) -> str:
    """The prompt text of one problem under a resolved template (module docstring).

    ``messages`` are the row's own chat messages (verl's RL schema), used verbatim by
    ``chat`` and ``raw``; the other templates use ``problem`` (their last user message).
    """
    if template == "compact":
        return f"Q:{problem} A:"
    if template == "qwen-math":
        return f"{problem}\n{QWEN_MATH_INSTRUCTION}"
    if template == "chat":
        if messages:
            return _chat(tokenizer, [{"role": m["role"], "content": m["content"]}
                                     for m in messages])
        return _chat(tokenizer, [{"role": "user", "content": f"{problem}\n"
                                                             f"{QWEN_MATH_INSTRUCTION}"}])
    if template == "qwen-math-system":
        return qwen_math_system_prompt(problem)
    if template == "ktae-train":
        return _chat(tokenizer, [{"role": "user", "content": f"{problem} {KTAE_TRAIN_INSTRUCTION}"}])
    if template == "dapo":
        return _chat(tokenizer, [{"role": "user", "content": _dapo_message(problem)}])
    if template == "raw":
        return "\n\n".join(m["content"] for m in messages) if messages else problem
    raise ValueError(f"template: expected one of {TEMPLATES[1:]}, got {template!r}")


def _message(record: BenchmarkRecord, template: str) -> str:
    if record.source == "embedded":
        return format_prompt(record.problem, template)
    return render_prompt(record.problem, template)


def build_prompt(record: BenchmarkRecord, template: str, tokenizer=None) -> str:
    """The prompt text for ``record`` under a resolved template (see module docstring)."""
    if record.source == "arith":  # the task's own instruction, as ktae train prompts it
        if template == "chat":
            if tokenizer is None:
                raise ValueError("tokenizer: required by the 'chat' template")
            return _chat(tokenizer, [{"role": "user", "content": user_message(record.problem)}])
        if template == "raw":
            return user_message(record.problem)
    if template == "chat":
        if tokenizer is None:
            raise ValueError("tokenizer: required by the 'chat' template")
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": _message(record, "qwen-math")}],
            tokenize=False, add_generation_prompt=True)
    if template not in TEMPLATES[1:]:
        raise ValueError(f"template: expected one of {TEMPLATES[1:]}, got {template!r}")
    if record.source == "embedded":
        if template in ("compact", "qwen-math"):
            return _message(record, template)
        # the bare problem of an embedded record is its question as the task states it
        return render_prompt(f"Compute {record.problem}.", template, tokenizer)
    return render_prompt(record.problem, template, tokenizer)
