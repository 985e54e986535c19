"""A run folder's file names are spelled once, as constants of cometnmt.training.checkpoint, and
every reader names them by those constants (a file renamed in one place was missed in another)."""

import ast
import re
from pathlib import Path

import cometnmt
from cometnmt.training import checkpoint

PACKAGE = Path(cometnmt.__file__).parent
# the literal of each constant, by the constant's name
RUN_FILES = {
    "LAST_CHECKPOINT": "last.pt",
    "BEST_CHECKPOINT": "best.pt",
    "EPOCH_CHECKPOINT_GLOB": "epoch*.pt",
    "METRICS_FILE": "metrics.jsonl",
    "CONFIG_FILE": "config.yaml",
}


def _literals_outside_definitions(path: Path) -> list[str]:
    """``path:line: 'name'`` for each string constant of the source equal to a run file's name,
    except the assignment defining that name's constant."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    defined = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and any(isinstance(t, ast.Name) and RUN_FILES.get(t.id) == getattr(node.value, "value", None)
                       for t in node.targets)}
    names = set(RUN_FILES.values())
    return [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in defined]


# a run file's name as a word inside a longer string: a log message's "best.pt is now %s", an
# f-string's literal part " (best.pt: step ", which the whole-string check above passed over
NAME_IN_TEXT = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(name) for name in RUN_FILES.values()) + r")(?!\w)")


def _names_inside_strings(path: Path) -> list[str]:
    """``path:line: 'text'`` for each string (an f-string's literal parts included) that holds a run
    file's name beside other text; docstrings, which describe the files, are passed over."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    relative = path.relative_to(PACKAGE.parent).as_posix()
    return [f"{relative}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and node.value not in RUN_FILES.values() and NAME_IN_TEXT.search(node.value)]


def test_the_constants_hold_the_names_the_trainer_writes():
    for name, literal in RUN_FILES.items():
        assert getattr(checkpoint, name) == literal
    assert checkpoint.EPOCH_CHECKPOINT.fullmatch(checkpoint.epoch_checkpoint_name(7))


def test_run_file_names_are_spelled_only_in_their_constants():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _literals_outside_definitions(path)]
    assert found == [], "run file names spelled by hand (use the constants of cometnmt.training.checkpoint):\n" + "\n".join(found)


def test_messages_name_run_files_by_their_constants():
    """The trainer's log messages ("best.pt is now %s", "metrics.jsonl: %d record(s) ... removed")
    and the reports' lines spelled the names inside longer strings, which the test above, matching
    whole strings, did not see."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _names_inside_strings(path)]
    assert found == [], "run file names spelled inside messages (use the constants of cometnmt.training.checkpoint):\n" + "\n".join(found)


def test_the_help_names_run_files_by_their_constants():
    """``train --resume``'s help spelled "last.pt" by hand (the test above let it pass, as the help
    could not import the constants without torch); it now reads the torch-free run_files module."""
    from cometnmt.cli import build_parser
    from cometnmt.training import run_files

    assert run_files.LAST_CHECKPOINT is checkpoint.LAST_CHECKPOINT
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    resume = next(action for action in train._actions if "--resume" in action.option_strings)
    assert resume.help.endswith(f"from {checkpoint.LAST_CHECKPOINT}")
