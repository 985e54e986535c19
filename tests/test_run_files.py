"""A run folder's file names are spelled once, as constants of cometnmt.training.checkpoint, and
every reader names them by those constants (a file renamed in one place was missed in another)."""

import ast
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


def test_the_constants_hold_the_names_the_trainer_writes():
    for name, literal in RUN_FILES.items():
        assert getattr(checkpoint, name) == literal
    assert checkpoint.EPOCH_CHECKPOINT.fullmatch(checkpoint.epoch_checkpoint_name(7))


def test_run_file_names_are_spelled_only_in_their_constants():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _literals_outside_definitions(path)]
    assert found == [], "run file names spelled by hand (use the constants of cometnmt.training.checkpoint):\n" + "\n".join(found)
