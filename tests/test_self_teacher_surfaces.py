"""SDPO on every surface (docs/method.md §17): compare arms, ``ktae explain --model``,
``ktae audit`` (the scoring model runs the self-teacher pass), the simulator's and the verl
plugin's one-line refusals."""

from __future__ import annotations

import pytest
import torch
from test_oar_g import GROUPS, _jsonl

import ktae


def test_compare_arms_set_its_options():
    from ktae.train.cli_compare import parse_arm

    arm = parse_arm("sdpo@lam=0.5@teacher_choice=random@teacher_seed=3")
    assert arm.credit == "sdpo"
    assert arm.overrides == {"estimator_options": {"lam": 0.5, "teacher_choice": "random",
                                                   "teacher_seed": 3}}
    assert parse_arm("grpo@self_distill=sdpg").overrides == {"self_distill": "sdpg"}
    with pytest.raises(ValueError, match="'bogus'"):
        parse_arm("sdpo@bogus=1")


def test_simulator_refuses_it_in_one_line():
    from ktae.sim.config import SimConfig
    from ktae.sim.run import simulate

    with pytest.raises(ValueError, match="after a privileged context") as err:
        simulate(SimConfig(horizons=(3,), n_opts=(2,), group_sizes=(4,), actions=6, steps=2,
                           lr=0.5, seeds=1, eval_every=2, audit_groups=0,
                           methods=("broadcast", "sdpo")))
    assert "\n" not in str(err.value)


def test_verl_plugin_refuses_it_in_one_line():
    from ktae.integrations.verl import options as verl

    with pytest.raises(ValueError, match=r"adv_estimator=sdpo: .*needs=teacher_logprobs") as err:
        verl.estimator_settings("sdpo", {"sdpo": {}})
    assert "\n" not in str(err.value)
    for kind in ("sdpo", "sdpo-token", "sdpg"):
        with pytest.raises(ValueError, match=rf"loss_mode: '{kind}' is ktae train's "
                                             "self-distillation term .*privileged prompt") as err:
            verl.calibration_settings({"loss_mode": kind})
        assert "\n" not in str(err.value)
        config = {"algorithm": {"adv_estimator": "grpo"}, "trainer": {},
                  "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": kind}}}}
        with pytest.raises(ValueError, match=f"loss_mode: '{kind}' is ktae train's"):
            verl.check_config(config)  # the plugin's start-up check
    with pytest.raises(ValueError, match=r"adv_estimator=sdpo: .*needs=teacher_logprobs"):
        verl.check_config({"algorithm": {"adv_estimator": "sdpo"}, "trainer": {},
                           "actor_rollout_ref": {"actor": {"policy_loss": {}}}})


def test_group_provider_reads_the_teacher_options():
    from test_oar_g import tiny_llama
    from test_self_teacher import Tok

    from ktae.groups.input import GroupInput
    from ktae.groups.teacher import teacher_groups
    from ktae.models.self_teacher import teacher_logprobs

    model = tiny_llama()
    responses = [[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1], [14, 1]]
    g = GroupInput(prompt="ab", responses=responses, rewards=[1.0, 0.0, 1.0, 1.0])
    teacher_groups(model, Tok(), [g], teacher_options={"teacher_choice": "shortest",
                                                       "teacher_template": "<{solution}>"})
    ids = torch.tensor([r + [0] * (5 - len(r)) for r in responses])
    mask = (torch.arange(5)[None] < torch.tensor([len(r) for r in responses])[:, None]).long()
    student = torch.tensor([lp + [0.0] * (5 - len(lp)) for lp in g.logprobs])
    prompt = torch.tensor([Tok()("ab")["input_ids"]] * 4)
    expected, has = teacher_logprobs(model, Tok(), prompt, torch.ones_like(prompt), ids, mask,
                                     correct=torch.tensor([True, False, True, True]),
                                     group=torch.zeros(4, dtype=torch.long),
                                     student_logprobs=student, choose="shortest",
                                     template="<{solution}>")
    assert has.all()
    for i, r in enumerate(responses):
        torch.testing.assert_close(torch.tensor(g.teacher_logprobs[i]), expected[i, :len(r)])


@pytest.mark.slow
def test_explain_and_audit_compute_it_with_the_model(tmp_path, capsys):
    from ktae.cli import main

    src = _jsonl(tmp_path / "groups.jsonl", GROUPS)
    out = tmp_path / "page.html"
    assert main(["explain", str(src), "--credit", "sdpo", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "after a privileged context" in err, err
    assert main(["explain", str(src), "--credit", "sdpo@lam=0.5@teacher_choice=shortest",
                 "--model", "default", "-o", str(out)]) == 0
    assert 'id="view-token"' in out.read_text(encoding="utf-8")
    result = ktae.audit(src, credit="grpo,sdpo,sdpo@lam=0.5", resamples=0)
    assert result["scored_with"] and set(result["methods"]) == {"grpo", "sdpo", "sdpo@lam=0.5"}
    m = {name: v["all"] for name, v in result["methods"].items()}
    assert m["sdpo"]["tokens_changed"]["mean"] > 0 and m["grpo"]["tokens_changed"]["mean"] == 0
    assert m["sdpo"]["mass_gap"] != m["sdpo@lam=0.5"]["mass_gap"]
    with pytest.raises(ValueError, match="sets the self-teacher's options"):
        ktae.audit(src, credit="sdpo,sdpo@teacher_choice=shortest", resamples=0)
