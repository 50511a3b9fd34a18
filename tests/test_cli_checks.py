"""Every subcommand refuses bad input in one line (``ktae SUB: message``, exit 2) before
any work and before its heavy libraries load: output paths, counts past their bounds,
bad options. Help and version read well; default outputs do not collide."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from ktae.cli import main

SHIPPED = next((Path(__file__).resolve().parents[1] / "src" / "ktae" / "models" / "shipped")
               .glob("embedded-*"))
HEAVY = ("trl", "transformers", "datasets", "matplotlib")

# argv -> the start of the one error line (in a fresh interpreter, cwd holding the file
# afile.txt and the directory adir)
CASES = [
    (["train", "-o", "afile.txt/sub"],
     "ktae train: --output-dir: cannot create afile.txt/sub: afile.txt is a file"),
    (["train", "-o", "afile.txt"], "ktae train: --output-dir: afile.txt exists and is not a dir"),
    (["compare", "-o", "afile.txt/sub"],
     "ktae compare: --output-dir: cannot create afile.txt/sub: afile.txt is a file"),
    (["compare", "-o", "afile.txt"],
     "ktae compare: --output-dir: afile.txt exists and is not a dir"),
    (["eval", str(SHIPPED), "-o", "afile.txt"], "ktae eval: --output-dir: afile.txt exists"),
    (["explain", "--model", "default", "-o", "adir"],
     "ktae explain: --output: adir is a directory"),
    (["explain", "--model", "default", "-o", "afile.txt/page.html"],
     "ktae explain: --output: cannot create afile.txt/page.html: afile.txt is a file"),
    (["explain", "--model", "default", "--png", "afile.txt"],
     "ktae explain: --png: afile.txt exists and is not a directory"),
    (["audit", "--model", "default", "-o", "afile.txt"],
     "ktae audit: --output-dir: afile.txt exists and is not a directory"),
    (["audit", "--model", "default", "-o", "afile.txt/x"],
     "ktae audit: --output-dir: cannot create afile.txt/x: afile.txt is a file"),
    (["simulate", "-o", "afile.txt"],
     "ktae simulate: --output-dir: afile.txt exists and is not a directory"),
    (["simulate", "-o", "afile.txt/x"],
     "ktae simulate: --output-dir: cannot create afile.txt/x: afile.txt is a file"),
    # counts past their bounds, each naming the option and the bound
    (["eval", str(SHIPPED), "--k", "99999999999"],
     "ktae eval: --k: expected at most 4,096 samples per problem, got 99,999,999,999"),
    (["eval", str(SHIPPED), "--k", "aime24=100000,4"], "ktae eval: --k: expected at most 4,096"),
    (["eval", str(SHIPPED), "--batch-size", "1000000"],
     "ktae eval: --batch-size: expected at most 4,096 prompts per generate call"),
    (["train", "--num-generations", "1000000"],
     "ktae train: --num-generations: expected at most 4,096 responses per prompt"),
    (["train", "--num-prompts", "10000000"], "ktae train: --num-prompts: expected at most"),
    (["compare", "--seeds", "1000000"], "ktae compare: --seeds: expected at most 10,000 seeds"),
    (["explain", "--model", "default", "--num-generations", "1000000"],
     "ktae explain: --num-generations: expected at most 4,096"),
    (["explain", "--model", "default", "--groups", "10000000"],
     "ktae explain: --groups: expected at most 100,000 groups"),
    (["audit", "--model", "default", "--samples", "1000000"],
     "ktae audit: --samples: expected at most 4,096 responses per prompt"),
    (["audit", "--model", "default", "--prompts", "10000000"],
     "ktae audit: --prompts: expected at most 100,000 prompts"),
    (["simulate", "--seeds", "1000000"], "ktae simulate: --seeds: expected at most 10,000"),
    (["simulate", "--group-size", "4,100000"], "ktae simulate: --group-size: expected at most"),
    # bad options of every subcommand: refused before trl, transformers, ...
    (["train", "--algo", "grpoo"], "ktae train: algo: expected one of"),
    (["compare", "--algo", "grpoo"], "ktae compare: algo: expected one of"),
    (["compare", "--seed", "2"], "ktae compare: --seed: the grid sets it (seeds K..K+N-1 with"),
    (["compare", "--resume"], "ktae compare: --resume: the grid sets it"),
    (["eval", str(SHIPPED), "--batch-size", "0"], "ktae eval: --batch-size: expected a positive"),
    (["explain", "--groups", "0"], "ktae explain: groups: expected a positive integer"),
    (["audit", "--samples", "1"], "ktae audit: samples: expected an integer >= 2"),
    (["simulate", "--steps", "0"], "ktae simulate: steps: expected a positive integer"),
    *[([sub, "--bogus"], f"ktae {sub}: unrecognized arguments: --bogus (see ktae {sub} --help)")
      for sub in ("train", "compare", "explain", "audit", "simulate")],
    (["eval", str(SHIPPED), "--backend", "nope"], "ktae eval: argument --backend: invalid"),
    (["bogus"], "ktae: argument COMMAND: invalid choice: 'bogus'"),
]

_SCRIPT = """
import contextlib, io, json, sys
from ktae.cli import main
heavy = HEAVY
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out.append({"rc": rc, "err": err.getvalue(),
                "heavy": [m for m in heavy if m in sys.modules]})
print(json.dumps(out))
""".replace("HEAVY", repr(HEAVY))


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """Each case's exit status, stderr and the heavy modules loaded by then, from one
    fresh interpreter."""
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "afile.txt").write_text("x")
    (cwd / "adir").mkdir()
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps([c[0] for c in CASES])],
                          cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1",
                               "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not list(cwd.glob("runs")), "a refused command wrote something"
    return dict(zip((" ".join(c[0]) for c in CASES), results, strict=True))


@pytest.mark.parametrize("argv, start", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_refused_in_one_line_before_heavy_imports(refusals, argv, start):
    got = refusals[" ".join(argv)]
    lines = [ln for ln in got["err"].splitlines() if ln.strip()]
    assert got["rc"] == 2, got
    assert len(lines) == 1 and lines[0].startswith(start), got["err"]
    assert "Traceback" not in got["err"]
    assert got["heavy"] == [], f"{argv} imported {got['heavy']} before refusing"


# --------------------------------------------------------------------------- help, version


def test_version_from_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ktae {metadata.version('ktae')}"


def test_top_level_help_is_written_for_users(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "one module per subcommand" not in text
    assert "token-level credit" in text and "docs/" in text and "--version" in text
    for sub in ("train", "compare", "eval", "explain", "audit", "simulate"):
        assert f"\n    {sub} " in text


def _train_help(capsys) -> str:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_train_help_shows_every_default(capsys):
    from ktae.train.flags import VALUE_FLAGS as _FLAGS

    text = _train_help(capsys)
    assert ("--clip-high CLIP_HIGH upper clip epsilon (DAPO clip-higher) (default depends on "
            "--algo: grpo 0.2, dapo 0.28, drgrpo 0.2)") in text
    assert "(default depends on --algo: grpo grpo, dapo dapo, drgrpo dr_grpo)" in text
    assert "(default depends on --algo: grpo 0, dapo 8 (--max-new-tokens x 0.2), drgrpo 0)" in text
    assert "force DAPO dynamic sampling on (default depends on --algo: grpo off, dapo on" in text
    assert "--ktae-h1 KTAE_H1 KTAE Fisher weight h1 (default 1)" in text
    assert "--taco-alpha TACO_ALPHA TACO tail threshold alpha (default 0.01)" in text
    assert "--taco-lambda TACO_LAMBDA TACO damping lambda (default 0.9)" in text
    assert "cached" not in text and "shipped inside ktae" in text
    starts = [text.index(f" {flag} {dest.upper()} ") for flag, dest, *_ in _FLAGS[1:]]
    for (flag, *_), start, end in zip(_FLAGS, [text.index(" --model MODEL "), *starts],
                                      [*starts, len(text)], strict=True):
        assert "default" in text[start:end], f"{flag}: {text[start:end]}"


def test_train_help_follows_the_algo_presets(capsys, monkeypatch):
    from ktae.runs import config

    monkeypatch.setitem(config._ALGO_DEFAULTS, "grpo",
                        {**config._ALGO_DEFAULTS["grpo"], "clip_high": 0.25})
    assert "(default depends on --algo: grpo 0.25, dapo 0.28, drgrpo 0.2)" in _train_help(capsys)


# --------------------------------------------------------------------------- default outputs


def test_default_outputs_are_named_and_kept(tmp_path, monkeypatch, capsys):
    """explain, audit and simulate write under runs/ by default, under a name that says
    what produced it, and refuse to replace an earlier result there without --overwrite."""
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "runs/explain/model-default-seed0-ktae-1groups.html"
    page.parent.mkdir(parents=True)
    page.write_text("earlier")
    assert main(["explain", "--model", "default", "--groups", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"ktae explain: --output: {page.relative_to(tmp_path)} exists; pass "
                   "--overwrite to replace it, or choose another --output")
    assert page.read_text() == "earlier"

    audit = tmp_path / "runs/audit/model-default-8x4-seed0-grpo"
    audit.mkdir(parents=True)
    (audit / "audit.md").write_text("earlier")
    assert main(["audit", "--model", "default", "--prompts", "8", "--samples", "4",
                 "--credit", "grpo"]) == 2
    assert "already holds a result (audit.md); pass --overwrite" in capsys.readouterr().err

    sim = tmp_path / "runs/simulate/quick-steps=3-seeds=1"
    sim.mkdir(parents=True)
    (sim / "results.md").write_text("earlier")
    assert main(["simulate", "--steps", "3", "--seeds", "1"]) == 2
    assert (f"ktae simulate: --output-dir: {sim.relative_to(tmp_path)} already holds a result "
            "(results.md)") in capsys.readouterr().err



def test_explicit_outputs_are_kept_too(tmp_path, capsys):
    """An earlier result at a path given with -o is not replaced without --overwrite
    either; nothing is computed before the refusal."""
    page = tmp_path / "mine.html"
    page.write_text("earlier")
    assert main(["explain", "--model", "default", "--groups", "1", "-o", str(page)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert page.read_text() == "earlier"
    for argv, marker in ((["audit", "--model", "default", "--prompts", "8", "--samples", "4",
                           "--credit", "grpo"], "audit.md"),
                         (["simulate", "--steps", "3", "--seeds", "1"], "results.md")):
        out = tmp_path / argv[0]
        out.mkdir()
        (out / marker).write_text("earlier")
        assert main([*argv, "-o", str(out)]) == 2
        assert f"already holds a result ({marker}); pass --overwrite" in \
            capsys.readouterr().err
        assert (out / marker).read_text() == "earlier"

def test_gitignore_holds_every_default_place():
    ignored = (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
    assert "runs/" in ignored and "eval-results/" in ignored


@pytest.mark.slow
def test_audit_prints_its_table_and_no_loading_bar(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    argv = ["audit", "--model", "default", "--prompts", "8", "--samples", "4", "--credit",
            "grpo,ktae", "--resamples", "10"]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    folder = Path("runs/audit/model-default-8x4-seed0-grpo,ktae")
    assert (folder / "audit.md").is_file()
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["method", "blame"])
    assert lines[header + 2].split()[0] == "grpo" and lines[header + 3].split()[0] == "ktae"
    assert f"full table with 95% intervals, per level and per step: {folder / 'audit.md'}" in out
    assert "Loading weights" not in err + out
    assert main(argv) == 2  # kept
    capfd.readouterr()
    assert main([*argv, "--overwrite"]) == 0


def test_counts_of_a_config_file_are_bounded_too(tmp_path, capsys):
    config = tmp_path / "big.yaml"
    config.write_text("num_generations: 100000\n")
    assert main(["train", "--config", str(config), "-o", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == ("ktae train: --num-generations: expected at "
                                               "most 4,096 responses per prompt, got 100,000")
    assert main(["compare", "--config", str(config), "-o", str(tmp_path / "cmp")]) == 2
    assert "ktae compare: --num-generations: expected at most" in capsys.readouterr().err
