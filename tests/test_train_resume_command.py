"""``ktae train``'s Ctrl-C hint: the command that continues the run."""

from ktae.train.cli_train import resume_command


def test_resume_command_keeps_plugins_given_before_train():
    argv = ["--plugin", "my_rule.py", "--plugin=pkg.credit", "train", "--credit", "mine",
            "-o", "old", "--resume"]
    assert resume_command("runs/x", argv) == (
        "ktae --plugin my_rule.py --plugin pkg.credit train --credit mine --resume -o runs/x")


def test_resume_command_keeps_flags_after_train():
    argv = ["train", "--plugin", "my_rule.py", "--credit", "mine", "--output-dir=old"]
    assert resume_command("runs/x", argv) == (
        "ktae train --plugin my_rule.py --credit mine --resume -o runs/x")
