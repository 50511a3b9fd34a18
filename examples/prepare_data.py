"""Write the papers' training and validation sets, prompted as the papers prompt them.

Each set becomes a verl-schema Parquet file: one row per problem with ``prompt`` (the chat
messages of the paper's prompt), ``data_source``, ``reward_model.ground_truth`` and
``extra_info.index``. verl reads it with ``data.prompt_key=prompt`` and ``ktae train``
with ``template: chat``, so both frameworks render the same prompt through the model's
chat template (docs/training.md, "GPU recipes").

    python examples/prepare_data.py ktae-7b --out data/ktae-7b        # MATH levels 3-5, MATH-500
    python examples/prepare_data.py ktae-1.5b --out data/ktae-1.5b    # MATH12k, MATH-500
    python examples/prepare_data.py taco --out data/taco              # DAPO-Math-17k, AIME 2024

Prompts:

* KTAE (appendix J: "the same prompt template (Qwen-Math template) for both RL training
  and validation"): the Qwen-Math instruction as the system message, the bare problem
  as the user message. Through Qwen2.5-Math's chat template this is the ``qwen-math-system``
  prompt character for character, the one the authors' ``eval/eval_baseline.py`` uses.
* TACO (appendix A: 'we instruct models to "Please reason step by step, and put your final
  answer within \\boxed{}"'): the problem followed by that instruction as the user message.
  DAPO-Math-17k's rows hold their own instruction (a final ``Answer:`` line) around the
  problem; it is removed first, and the set's repeated rows are kept once.

``data_source`` names the recipe (``ktae-recipe/...``, ``taco-recipe/...``), not a source
verl has a scorer for: the verl examples score every row with
``examples/verl/boxed_reward.py`` (the boxed reward of ``ktae train --reward boxed``), and a
run that forgets it fails on the first batch instead of scoring with another rule.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ktae.data import load_examples
from ktae.eval.prompts import DAPO_PREFIX, DAPO_SUFFIX, QWEN_MATH_INSTRUCTION

MATH_TRAIN = "hf:DigitalLearningGmbH/MATH-lighteval@train"
MATH12K = "hf:hiyouga/math12k@train"
MATH500 = "hf:HuggingFaceH4/MATH-500@test"
DAPO_MATH_17K = "hf:BytedTsinghua-SIA/DAPO-Math-17k@train"
AIME_2024 = "hf:HuggingFaceH4/aime_2024@train"
LEVELS_3_TO_5 = {"level": ["Level 3", "Level 4", "Level 5"]}


def qwen_math_system_messages(problem: str) -> list[dict]:
    """KTAE's prompt: the Qwen-Math instruction as the system turn, the problem as the user's."""
    return [{"role": "system", "content": QWEN_MATH_INSTRUCTION},
            {"role": "user", "content": problem}]


def boxed_instruction_messages(problem: str) -> list[dict]:
    """TACO's prompt: the problem, then the boxed instruction, as the user turn."""
    return [{"role": "user", "content": f"{problem}\n{QWEN_MATH_INSTRUCTION}"}]


def bare_dapo_problem(text: str) -> str:
    """A DAPO-Math-17k problem without the set's own answer-line instruction."""
    if text.startswith(DAPO_PREFIX) and text.endswith(DAPO_SUFFIX):
        return text[len(DAPO_PREFIX):len(text) - len(DAPO_SUFFIX)]
    return text


#: recipe -> (train source, train filters, validation source, prompt, strip DAPO wrapper)
RECIPES = {
    "ktae-7b": (MATH_TRAIN, LEVELS_3_TO_5, MATH500, qwen_math_system_messages, False),
    "ktae-1.5b": (MATH12K, {}, MATH500, qwen_math_system_messages, False),
    "taco": (DAPO_MATH_17K, {}, AIME_2024, boxed_instruction_messages, True),
}


def rows_of(source: str, *, filters: dict, messages, strip_dapo: bool, tag: str) -> list[dict]:
    """verl-schema rows of one source; repeated problems (same text and answer) kept once."""
    seen = set()
    rows = []
    for example in load_examples(source, filters=filters or None):
        problem = bare_dapo_problem(example.problem) if strip_dapo else example.problem
        key = (problem, example.answer)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"data_source": tag, "prompt": messages(problem), "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": example.answer},
                     "extra_info": {"index": len(rows), "id": example.id}})
    return rows


def write_parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare(recipe: str, out: Path, *, train: str | None = None, val: str | None = None
            ) -> dict[str, int]:
    """Write ``out/train.parquet`` and ``out/val.parquet``; returns their row counts.

    ``train`` / ``val`` replace the recipe's sources (a local copy of the same data: any
    ``ktae.data`` source string, e.g. ``parquet:PATH`` or a ``save_to_disk`` directory)."""
    default_train, filters, default_val, messages, strip = RECIPES[recipe]
    train, val = train or default_train, val or default_val
    counts = {}
    for split, source, split_filters in (("train", train, filters), ("val", val, {})):
        rows = rows_of(source, filters=split_filters, messages=messages,
                       strip_dapo=strip and split == "train",
                       tag=f"{recipe.split('-')[0]}-recipe/{split}")
        write_parquet(rows, out / f"{split}.parquet")
        counts[split] = len(rows)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("--out", type=Path, required=True, help="directory for the files")
    parser.add_argument("--train", help="the training set's source, if not the hub's copy")
    parser.add_argument("--val", help="the validation set's source, if not the hub's copy")
    args = parser.parse_args(argv)
    counts = prepare(args.recipe, args.out, train=args.train, val=args.val)
    for split, n in counts.items():
        print(f"{args.out / (split + '.parquet')}: {n} problems")


if __name__ == "__main__":
    main()
