"""studies/credit-study/credit_study.py: the join of compare, audit and simulate outputs, its
statistics (checked against scipy), the missing-method list and the report's numbers.

Inputs are written by the real writers where cheap (``TrainConfig.save`` for the runs'
``config.yaml``, ``ktae.credit_audit.report.write_outputs`` for ``audit.json``, a tiny
``ktae.sim`` run and ``ktae.sim.report.write_json`` for ``curves.json``); ``summary.json``
carries the keys ``ktae train`` writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "credit_study", ROOT / "studies" / "credit-study" / "credit_study.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cs = _load()

# held-out accuracy after training per (credit, seed): ktae clearly above GRPO
ACC = {("none", 0): 0.70, ("none", 1): 0.72, ("none", 2): 0.71,
       ("ktae", 0): 0.80, ("ktae", 1): 0.83, ("ktae", 2): 0.79,
       ("taco", 0): 0.69, ("taco", 1): 0.73,
       ("ktae@ngram=2", 0): 0.75, ("ktae@ngram=2", 1): 0.74}


def write_run(root: Path, label: str, seed: int, acc: float | None) -> Path:
    from ktae.runs.config import TrainConfig
    from ktae.train.cli_compare import parse_arm

    arm = parse_arm(label)
    run = root / f"{arm.dirname}-seed{seed}"
    run.mkdir(parents=True)
    TrainConfig(credit=arm.credit, seed=seed, output_dir=str(run), max_steps=10,
                **arm.overrides).save(run / "config.yaml")
    if acc is not None:
        (run / "summary.json").write_text(json.dumps({
            "is_main": True, "steps": 10, "heldout_before": 0.5, "heldout_after": acc,
            "heldout_carry_before": 0.2, "heldout_carry_after": acc - 0.1}))
    return run


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("compare")
    for (label, seed), acc in ACC.items():
        write_run(root, label, seed, acc)
    write_run(root, "taco", 2, None)  # unfinished
    return root


def _figure(mean, low=None, high=None):
    low = mean if low is None else low
    high = mean if high is None else high
    return {"mean": mean, "low": low, "high": high, "responses": 10, "groups": 5}


AUDIT_FIGURES = {  # blame, contamination, mass gap per audit method
    "grpo": (0.50, 0.13, 0.0), "ktae": (0.61, 0.12, -0.2), "taco": (0.52, 0.14, -0.01),
    "ktae@ngram=2": (0.58, 0.15, -0.3), "gtpo": (0.20, 0.40, 0.1)}


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory) -> Path:
    from ktae.credit_audit.report import write_outputs

    methods = {}
    for name, (blame, cont, gap) in AUDIT_FIGURES.items():
        methods[name] = {"all": {
            "blame": _figure(blame, blame - 0.02, blame + 0.02),
            "lowest": _figure(blame / 2), "contamination": _figure(cont, cont - 0.01, cont + 0.01),
            "chance": _figure(0.15), "contamination_vs_grpo": _figure(cont - 0.13),
            "mass_gap": _figure(gap, gap - 0.05, gap + 0.05),
            "tokens_changed": _figure(0.0 if name == "grpo" else 0.3),
            "scale": _figure(1.0 if name == "grpo" else 1.1)}, "levels": {}, "steps": {}}
    result = {"methods": methods, "levels": [], "steps": [], "input": "synthetic",
              "kind": "model", "prompt_set": 3, "resamples": 10,
              "counts": {"groups": 50, "mixed_groups": 20, "responses": 400, "wrong_answers": 100,
                         "responses_with_wrong_tokens": 90, "right_answers_with_wrong_tokens": 2,
                         "tokens": {"wrong": 200, "right": 3000, "other": 3000}}}
    folder = tmp_path_factory.mktemp("audit")
    write_outputs(result, folder)
    return folder


def _simulate(folder: Path, methods, ngram=1) -> Path:
    import torch

    from ktae.sim import report
    from ktae.sim.config import SimConfig
    from ktae.sim.run import simulate

    torch.set_num_threads(1)
    cfg = SimConfig(horizons=(4,), n_opts=(2,), group_sizes=(4,), actions=8, steps=20, lr=0.5,
                    seeds=3, eval_every=10, methods=methods, audit_groups=4, ktae_ngram=ngram)
    folder.mkdir(parents=True, exist_ok=True)
    report.write_json(simulate(cfg), folder / "curves.json")
    return folder


@pytest.fixture(scope="module")
def sim_dirs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("sim")
    return [_simulate(root / "plain", ("broadcast", "ktae", "taco")),
            _simulate(root / "ngram2", ("broadcast", "ktae"), ngram=2)]


# ------------------------------------------------------------------------ names


def test_names_match_across_tools():
    assert cs.canonical_name("none") == "grpo"
    assert cs.canonical_name("broadcast") == "grpo"
    assert cs.canonical_name("ktae", 3) == "ktae@ngram=3"
    assert cs.canonical_name("taco", 3) == "taco"  # the n-gram setting is KTAE's alone
    assert cs.simulate_name("grpo") == ("broadcast", 1)
    assert cs.simulate_name("ktae@ngram=3") == ("ktae", 3)
    assert cs.simulate_name("ktae+taco") == ("ktae+taco", 1)
    # any registered estimator runs in the simulator, with its own options
    assert cs.simulate_name("gtpo") == ("gtpo", 1)
    assert cs.simulate_name("prefix-value@total=add") == ("prefix-value@total=add", 1)
    assert cs.simulate_name("ktae+taco@h1=0.5") is None  # the simulator's KTAE+TACO: spans only
    assert cs.simulate_name("ktae@apply=wrong@ngram=3") == ("ktae@apply=wrong@ngram=3", 1)
    assert cs.simulate_name("prefix-value@nope=1") is None
    # the same method however its options are written
    assert cs.canonical_name("prefix-value@weight=0.5@total=add") == cs.canonical_name(
        "prefix-value", 1, {"total": "add", "weight": 0.5}) == "prefix-value@total=add@weight=0.5"


def test_arms_of_one_rule_with_own_options_stay_apart(tmp_path):
    """``prefix-value`` and ``prefix-value@weight=0.5`` are two methods, named as the
    audit names them, not two runs of one method."""
    assert cs.canonical_name("prefix-value", 1, {"weight": 0.5}) == "prefix-value@weight=0.5"
    write_run(tmp_path, "prefix-value", 0, 0.7)
    write_run(tmp_path, "prefix-value@weight=0.5", 0, 0.6)
    runs = cs.read_compare([tmp_path])["runs"]
    assert runs["prefix-value"][0]["heldout_after"] == 0.7
    assert runs["prefix-value@weight=0.5"][0]["heldout_after"] == 0.6


def test_audit_overlap():
    assert cs.audit_overlap(3, 100, [300]).startswith("disjoint (held-out problems 300..399")
    assert cs.audit_overlap(1, 200, [300]).startswith("OVERLAPPING in up to 100 problems")
    assert cs.audit_overlap(None, 100, [300]).startswith("unknown")


def test_parse_seeds():
    assert cs.parse_seeds("3") == [0, 1, 2]
    assert cs.parse_seeds("0,2") == [0, 2]
    assert cs.parse_seeds(None) is None


# ------------------------------------------------------------------------ statistics


def test_welch_matches_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.8, 0.02, 5), rng.normal(0.78, 0.04, 4)
    w = cs.welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert w["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert w["df"] == pytest.approx(ref.df, rel=1e-10)
    ci = ref.confidence_interval(0.95)
    assert (w["low"], w["high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert w["diff"] == pytest.approx(a.mean() - b.mean())


def test_welch_edge_cases():
    assert cs.welch([0.5], [0.4, 0.3])["p"] is None
    assert cs.welch([0.5], [0.4, 0.3])["diff"] == pytest.approx(0.15)
    assert cs.welch([0.5, 0.5], [0.5, 0.5])["low"] is None
    assert cs.welch([], [0.5])["diff"] is None


def test_paired_matches_scipy():
    a, b = np.array([0.9, 0.8, 0.85, 0.95]), np.array([0.7, 0.72, 0.69, 0.8])
    p = cs.paired(a, b)
    ref = stats.ttest_rel(a, b)
    assert p["p"] == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert (p["low"], p["high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_spearman_matches_scipy_and_bootstraps():
    x = np.array([0.5, 0.6, 0.55, 0.7, 0.2, 0.9])
    y = np.array([0.0, 0.05, 0.01, 0.04, -0.1, 0.08])
    s = cs.spearman(x, y, resamples=300)
    ref = stats.spearmanr(x, y)
    assert s["rho"] == pytest.approx(ref.statistic)
    assert s["p"] == pytest.approx(ref.pvalue)
    assert s["n"] == 6 and s["low"] <= s["rho"] <= s["high"] <= 1.0
    assert cs._rho(x, y) == pytest.approx(ref.statistic)
    assert cs.spearman(x[:2], y[:2])["rho"] is None  # too few points
    assert cs.spearman([1, 1, 1, 1], [1, 2, 3, 4])["rho"] is None  # no spread


def test_conclusions_follow_the_verdicts():
    corrs = [{"testbed": "audit", "figure": "blame", "target": "train_gain", "rho": 0.9, "n": 6,
              "verdict": "predicts"},
             {"testbed": "mdp", "figure": "mass_gap", "target": "train_gain", "rho": 0.1, "n": 6,
              "verdict": "no evidence"},
             {"testbed": "mdp", "figure": "blame", "target": "mdp_gain", "rho": -0.8, "n": 6,
              "verdict": "predicts, reversed"}]
    train = "\n".join(cs.conclusions(corrs, "train_gain"))
    assert "Predicted it: audit blame (rho +0.90, n 6)." in train
    assert "No evidence either way (interval holds 0): mdp mass_gap (rho +0.10, n 6)." in train
    assert "mdp blame" not in train
    assert "reverse of the audit's reading: mdp blame (rho -0.80" in "\n".join(
        cs.conclusions(corrs, "mdp_gain"))


def test_verdicts():
    strong = {"rho": 0.95, "low": 0.6, "high": 1.0, "p": 0.001, "n": 6}
    assert cs.verdict(strong, +1) == "predicts"
    assert cs.verdict(strong, -1) == "predicts, reversed"
    assert cs.verdict(strong, 0) == "related"
    assert cs.verdict({**strong, "low": -0.1}, +1) == "no evidence"
    assert cs.verdict({**strong, "p": 0.2}, +1) == "no evidence"
    assert cs.verdict({**strong, "n": 4}, +1) == "too few methods"


# ------------------------------------------------------------------------ readers and join


def test_read_compare_names_seeds_and_unfinished(compare_dir):
    c = cs.read_compare([compare_dir])
    assert set(c["runs"]) == {"grpo", "ktae", "taco", "ktae@ngram=2"}
    assert sorted(c["runs"]["grpo"]) == [0, 1, 2]
    assert c["unfinished"] == [str(compare_dir / "taco-seed2")]
    only = cs.read_compare([compare_dir], seeds=[0, 1])
    assert sorted(only["runs"]["ktae"]) == [0, 1]
    assert only["unfinished"] == []  # taco seed 2 is outside the chosen seeds


def test_read_audit(audit_dir):
    a = cs.read_audit(audit_dir)
    assert a["prompt_set"] == 3
    assert a["methods"]["ktae"]["blame"]["mean"] == pytest.approx(0.61)
    assert a["methods"]["ktae@ngram=2"]["mass_gap"]["mean"] == pytest.approx(-0.3)


def test_read_simulate_names_and_pairing(sim_dirs):
    s = cs.read_simulate(sim_dirs, update=0)
    assert set(s["methods"]) == {"grpo", "ktae", "taco", "ktae@ngram=2"}
    data = json.loads((sim_dirs[0] / "curves.json").read_text())
    ktae_final = [row[-1] for c in data["curves"] if c["method"] == "ktae" for row in c["returns"]]
    assert s["methods"]["ktae"]["final"] == pytest.approx(ktae_final)
    # the n-gram folder's own broadcast is its reference
    data2 = json.loads((sim_dirs[1] / "curves.json").read_text())
    bc2 = [row[-1] for c in data2["curves"] if c["method"] == "broadcast" for row in c["returns"]]
    assert s["methods"]["ktae@ngram=2"]["reference"] == pytest.approx(bc2)
    assert s["methods"]["ktae"]["figures"]["blame"] == data["audit"]["results"]["0"]["ktae"]["all"]["blame"]
    last = cs.read_simulate(sim_dirs, update="last")
    assert last["update"] == ["20", "20"]


def test_join_gains_and_missing(compare_dir, audit_dir, sim_dirs):
    j = cs.join(cs.read_compare([compare_dir]), cs.read_audit(audit_dir),
                cs.read_simulate(sim_dirs))
    rows = j["methods"]
    g = rows["ktae"]["train_gain"]
    ref = stats.ttest_ind([0.80, 0.83, 0.79], [0.70, 0.72, 0.71], equal_var=False)
    assert g["diff"] == pytest.approx(np.mean([0.80, 0.83, 0.79]) - np.mean([0.70, 0.72, 0.71]))
    assert g["p"] == pytest.approx(ref.pvalue)
    assert rows["grpo"]["train_gain"]["diff"] == 0.0
    assert rows["taco"]["seeds"] == [0, 1]
    assert j["missing"]["compare"] == ["gtpo"]
    assert j["missing"]["simulate"] == ["gtpo"]
    assert j["missing"]["audit"] == []
    assert rows["gtpo"]["train_gain"] is None and rows["gtpo"]["audit"]["blame"]["mean"] == 0.2
    sim = cs.read_simulate(sim_dirs)["methods"]
    d = np.array(sim["ktae"]["final"]) - np.array(sim["grpo"]["final"])
    assert rows["ktae"]["mdp_gain"]["diff"] == pytest.approx(d.mean())


def test_partial_methods_stay_out_of_the_correlations(compare_dir, audit_dir):
    j = cs.join(cs.read_compare([compare_dir]), cs.read_audit(audit_dir), None, min_seeds=3)
    assert j["methods"]["taco"]["partial"] and not j["methods"]["ktae"]["partial"]
    assert j["methods"]["taco"]["train_gain"]["diff"] is not None  # still in the table
    c = next(c for c in cs.correlations(j, resamples=50)
             if (c["testbed"], c["figure"], c["target"]) == ("audit", "blame", "train_gain"))
    assert sorted(c["methods"]) == ["grpo", "ktae"]


def test_correlations_use_the_joined_numbers(compare_dir, audit_dir, sim_dirs):
    j = cs.join(cs.read_compare([compare_dir]), cs.read_audit(audit_dir),
                cs.read_simulate(sim_dirs))
    corrs = cs.correlations(j, resamples=200)
    c = next(c for c in corrs if (c["testbed"], c["figure"], c["target"]) ==
             ("audit", "blame", "train_gain"))
    names = ["grpo", "ktae", "taco", "ktae@ngram=2"]
    assert sorted(c["methods"]) == sorted(names)  # gtpo has no training gain
    x = [AUDIT_FIGURES[m][0] for m in c["methods"]]
    y = [j["methods"][m]["train_gain"]["diff"] for m in c["methods"]]
    assert c["rho"] == pytest.approx(stats.spearmanr(x, y).statistic)
    assert c["n"] == 4 and c["verdict"] == "too few methods"


# ------------------------------------------------------------------------ the command


def test_command_writes_report_with_the_numbers(compare_dir, audit_dir, sim_dirs, tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["--compare", str(compare_dir), "--audit", str(audit_dir), "--seeds", "0,1",
            "--resamples", "100", "--preliminary", "two seeds only", "-o", str(out)]
    for d in sim_dirs:
        argv += ["--simulate", str(d)]
    assert cs.main(argv) == 0
    study = json.loads((out / "credit_study.json").read_text())
    md = (out / "credit_study.md").read_text()
    assert "**PRELIMINARY**: two seeds only" in md
    assert "prompt set 3" in md and study["inputs"]["prompt_set"] == 3
    assert study["inputs"]["seeds"] == [0, 1]
    assert "Training settings (max_steps, learning_rate, eval_size): the same for every method" in md
    from ktae.runs.config import TrainConfig

    overlap = cs.audit_overlap(3, 50, [TrainConfig().eval_size])
    assert study["inputs"]["overlap"] == overlap and overlap in md
    gain = study["joined"]["methods"]["ktae"]["train_gain"]
    assert gain["n_a"] == 2  # --seeds 0,1 keeps seed 2 out
    assert study["inputs"]["min_seeds"] == 2 and "| taco | 2 |" in md  # taco seed 2 unfinished
    assert f"{gain['diff']:+.3f} [{gain['low']:+.3f}, {gain['high']:+.3f}]" in md
    assert "not in compare: gtpo" in md and "not in simulate: gtpo" in md
    for c in study["correlations"]:
        if c["rho"] is not None:
            assert f"| {c['testbed']} | {c['figure']} | {c['target']} | {c['rho']:+.2f}" in md
    assert "## What predicted the training gain" in md and "## What predicted the MDP gain" in md
    assert (out / "scatter_audit.png").stat().st_size > 0
    assert (out / "scatter_mdp.png").stat().st_size > 0
    assert cs.main(argv) == 0  # its own folder may be rewritten


def test_command_reports_two_runs_of_one_method_and_seed(tmp_path):
    write_run(tmp_path / "a", "none", 0, 0.7)
    write_run(tmp_path / "b", "none", 0, 0.7)
    with pytest.raises(SystemExit, match="two finished runs of grpo seed 0"):
        cs.main(["--compare", str(tmp_path / "a"), "--compare", str(tmp_path / "b"),
                 "-o", str(tmp_path / "out")])


def test_command_refuses_a_folder_it_did_not_write(compare_dir, tmp_path):
    (tmp_path / "other.txt").write_text("x")
    with pytest.raises(SystemExit, match="did not write"):
        cs.main(["--compare", str(compare_dir), "-o", str(tmp_path)])


def test_run_options_build_the_commands(compare_dir, audit_dir, sim_dirs, tmp_path, monkeypatch):
    """--run-audit and --run-simulate call ktae with the study's methods and settings (a
    stand-in copies the fixtures' outputs where the real commands would write)."""
    import shutil

    calls = []

    def fake(argv):
        calls.append(argv)
        out = Path(argv[argv.index("-o") + 1])
        if argv[0] == "audit":
            shutil.copytree(audit_dir, out)
        else:
            ngram = argv[argv.index("--ktae-ngram") + 1]
            shutil.copytree(sim_dirs[0] if ngram == "1" else sim_dirs[1], out)

    monkeypatch.setattr(cs, "run_tool", fake)
    out = tmp_path / "study"
    assert cs.main(["--compare", str(compare_dir), "--run-audit", "--prompt-set", "5",
                    "--audit-prompts", "40", "--run-simulate", "--sim-seeds", "2",
                    "--sim-update", "last", "--threads", "2", "--resamples", "50", "--min-seeds", "3",
                    "-o", str(out)]) == 0
    audit, *sims = calls
    assert audit[:3] == ["audit", "--model", "default"]
    assert audit[audit.index("--credit") + 1].split(",") == ["grpo", "ktae", "ktae@ngram=2",
                                                             "taco"]
    assert audit[audit.index("--prompt-set") + 1] == "5"
    assert audit[audit.index("--prompts") + 1] == "40"
    assert audit[audit.index("--threads") + 1] == "2"
    plain = next(s for s in sims if s[s.index("--ktae-ngram") + 1] == "1")
    ngram = next(s for s in sims if s[s.index("--ktae-ngram") + 1] == "2")
    assert plain[plain.index("--methods") + 1].split(",") == ["broadcast", "ktae", "taco"]
    assert ngram[ngram.index("--methods") + 1].split(",") == ["broadcast", "ktae"]
    assert plain[plain.index("--seeds") + 1] == "2" and plain[plain.index("--preset") + 1] == "quick"
    study = json.loads((out / "credit_study.json").read_text())
    assert study["inputs"]["audit"] == str(out / "audit")
    assert study["inputs"]["sim_update"] == ["20", "20"]
    assert study["joined"]["methods"]["taco"]["partial"] and not study["joined"]["methods"]["ktae"]["partial"]
    assert "| taco | 2 (partial) |" in (out / "credit_study.md").read_text()
    assert sorted(study["inputs"]["simulate"]) == sorted([str(out / "simulate"),
                                                          str(out / "simulate-ngram=2")])


def test_every_method_keeps_one_distinct_style_across_figures():
    names = [f"m{i}" for i in range(25)]
    styles = cs.method_styles(names)
    assert len(set(styles.values())) == 25  # marker and colour together tell them apart
    assert cs.method_styles(reversed(names)) == styles  # by name, not by order of arrival
