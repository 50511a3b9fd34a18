"""verl custom reward: ktae's strict boxed reward, the one ``ktae train --reward boxed`` uses.

The verl examples that train on prompts asking for ``\\boxed{}`` (the KTAE paper's
Qwen-Math prompt, the TACO paper's instruction) point verl here:

    reward.custom_reward_function.path=examples/verl/boxed_reward.py
    reward.custom_reward_function.name=compute_score

The answer is the last ``\\boxed{}`` of the response, checked for equivalence with the
reference (normalised match, exact decimals, then math-verify, under a hard time limit in
a persistent verifier process). The result carries ``acc``, the verifier's correctness:
verl's ``dapo`` reward manager keeps it beside the shaped score, DAPO's group filter
(``algorithm.filter_groups.metric=acc``) and KTAE's correct/incorrect split read it.
"""

from __future__ import annotations

from ktae.rewards.registry import score_boxed


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's ``compute_score`` signature; ``data_source`` and ``extra_info`` are unused."""
    result = score_boxed([solution_str], [ground_truth])[0]
    return {"score": float(result.score), "acc": bool(result.correct)}
