"""`cometnmt render`: a report folder's report.md and figures rewritten from its report.json alone
(committed reports keep report.json, not their runs): the same report.md as the run wrote, but for
a line saying it was re-rendered, from which file and by which commit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import REPO
from test_reproduce import TINY

RENDERED = "- **re-rendered** on "


def _without_rendered_line(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(RENDERED))


def _check_rendered(cli, tmp_path, out):
    """Render ``out``'s report.json into another folder and in place; both give the run's report.md
    but for one line, which names the file and keeps the run's provenance lines."""
    written = (out / "report.md").read_text()
    report_json = (out / "report.json").read_bytes()
    for pic in out.glob("*.png"):
        pic.unlink()
    shutil.rmtree(out / "runs")  # nothing but report.json is read: no run folder, checkpoint or hypothesis

    other = tmp_path / "rendered"
    proc = cli("render", str(out / "report.json"), "--out", str(other))
    assert str(other / "report.md") in proc.stdout
    text = (other / "report.md").read_text()
    assert _without_rendered_line(text) == _without_rendered_line(written) and text != written
    line = next(line for line in text.splitlines() if line.startswith(RENDERED))
    assert f"from `{out / 'report.json'}`" in line and "at commit `" in line and "every number is that file's" in line
    assert text.splitlines().index(line) < text.splitlines().index(written.splitlines()[2])  # above the run's own lines
    assert (other / "report.json").read_bytes() == report_json
    cli("render", str(out / "report.json"))  # in place: report.json is left as it is
    assert _without_rendered_line((out / "report.md").read_text()) == _without_rendered_line(written)
    assert (out / "report.json").read_bytes() == report_json
    return other


def test_render_gives_the_report_the_run_wrote(cli, tmp_path):
    out = tmp_path / "report"
    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--jobs", "2", "--out", str(out), *TINY)
    other = _check_rendered(cli, tmp_path, out)
    for name in ("figure4_bleu_by_length.png", "learning_curves.png"):
        assert (other / name).stat().st_size > 0 and (out / name).stat().st_size > 0, name

    # compare's report too (it names its systems): two tiny configs, one trained run each
    base = tmp_path / "a.yaml"
    base.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\nname: a\n")
    (tmp_path / "b.yaml").write_text(f"base: {base}\nname: b\nmodel: {{d_ff: 32}}\n")
    cmp = tmp_path / "cmp"
    shutil.rmtree(tmp_path / "rendered")
    cli("compare", str(base), str(tmp_path / "b.yaml"), "--seeds", "1", "--out", str(cmp), "--metrics", "bleu", "paper",
        "--set", "data.max_train_pairs=200", "--set", "data.max_valid_pairs=20", "--set", "train.max_epochs=1",
        "--set", "train.num_threads=1", "--eval-limit", "20", "--bootstrap", "20")
    other = _check_rendered(cli, tmp_path, cmp)
    assert (other / "learning_curves.png").stat().st_size > 0


def test_render_refuses_what_is_not_a_report(cli, tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"runs": []}))
    proc = cli("render", str(bad), check=False)
    assert proc.returncode == 2 and f"{bad}: not a cometnmt reproduce or compare report.json" in proc.stderr
    proc = cli("render", str(tmp_path / "none.json"), check=False)
    assert proc.returncode == 2 and "none.json: no such file" in proc.stderr


def test_an_older_report_json_is_shown_as_todays_code_writes_it():
    """report.json of older code: a one-seed row's sd written as 0.0 (shown '± 0.00', a spread one
    seed has not), the runs trained without some overrides not kept, examples without their seed.
    Each is derived from the file's own numbers; where the examples' scores fit no seed, none is named."""
    from cometnmt.render import _as_written_today

    split = {"sentence_bleu": [10.0, 50.0, 30.0]}
    runs = [{"row": "comet", "seed": 2, "command": "python -m cometnmt train comet.yaml --set train.seed=2", "test": split},
            {"row": "transformer", "seed": 2, "command": "python -m cometnmt train t.yaml --set train.lr=1", "test":
             {"sentence_bleu": [20.0, 40.0, 30.0]}}]
    report = {"provenance": {"overrides": ["train.lr=1"]}, "runs": runs,
              "table": [{"row": "comet", "seeds": [2], "test_bleu": [30.0, 0.0], "epochs": [3, 0.0], "label": "COMET"},
                        {"row": "transformer", "seeds": [1, 2], "test_bleu": [30.0, 1.0]}],
              "examples": [{"index": 1, "comet_bleu": 50.0, "transformer_bleu": 40.0}]}
    shown = _as_written_today(report, reproduce=True)
    assert shown["provenance"]["runs_without_overrides"] == {"comet seed 2": ["train.lr=1"]}
    assert shown["table"][0] == {"row": "comet", "seeds": [2], "test_bleu": [30.0, None], "epochs": [3, None], "label": "COMET"}
    assert shown["table"][1]["test_bleu"] == [30.0, 1.0]  # two seeds: their sd is kept
    assert shown["examples"][0]["seed"] == 2
    assert "runs_without_overrides" not in report["provenance"] and "seed" not in report["examples"][0]  # a copy
    report["examples"][0]["transformer_bleu"] = 41.0  # no seed's scores: no seed named
    assert "seed" not in _as_written_today(report, reproduce=True)["examples"][0]


def test_an_older_compare_report_names_each_seeds_checkpoints():
    """compare's report.json of older code kept the first seed's checkpoint per row, not each seed's
    (report.md was written from the runs): rendered, a row of runs averaging other epochs named the
    first seed's epochs alone. They come from the runs' records now."""
    from cometnmt.compare import _checkpoint_label
    from cometnmt.render import _as_written_today

    runs = [{"row": "a", "seed": s, "checkpoint": [f"epoch00{e}.pt" for e in ends]} for s, ends in ((2, (2, 3)), (1, (3, 4)))]
    report = {"provenance": {}, "runs": runs, "systems": ["a"],
              "table": [{"system": "a", "seeds": [1, 2], "checkpoint": runs[1]["checkpoint"]}]}
    entry = _as_written_today(report, reproduce=False)["table"][0]
    assert _checkpoint_label(entry) == "seed 1: average of 2 (epoch003.pt … epoch004.pt); seed 2: average of 2 (epoch002.pt … epoch003.pt)"


def _committed(name: str, tmp_path) -> tuple[dict, "Path"]:
    """A committed report's report.json, loaded, and the path a test writes its changed copy to."""
    return json.loads((REPO / "reports" / name / "report.json").read_text(encoding="utf-8")), tmp_path / name / "report.json"


def _write(path, report: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return path


def test_every_committed_report_json_has_what_this_commit_s_report_shows():
    """The shape check (render's first step) accepts every committed report.json: a key the renderer
    does not need is not demanded of them."""
    from cometnmt.render import check_report_shape, read_report

    found = sorted((REPO / "reports").glob("*/report.json"))
    assert len(found) >= 7
    for path in found:
        report = read_report(path)
        check_report_shape(path, report, "systems" in report)  # raises where it lacks something


def test_render_names_the_first_key_path_a_report_json_lacks(cli, tmp_path):
    """A report.json without a key (or with a value of another type) that today's report shows is
    refused before anything is drawn, naming the file and the key's path; it was a KeyError's repr
    ("lacks what this commit's report shows (KeyError('seeds'))"), naming neither row nor run."""
    import pytest

    from cometnmt.errors import CometNMTError
    from cometnmt.render import render_report

    report, path = _committed("tie_embeddings_cpu", tmp_path)  # compare's
    del report["table"][1]["seeds"]
    proc = cli("render", str(_write(path, report)), check=False)
    assert proc.returncode == 2 and f"{path}: table[1].seeds is missing" in proc.stderr, proc.stderr
    assert "provenance.commit: " in proc.stderr and not list(path.parent.glob("*.png"))  # nothing drawn

    report, path = _committed("tie_embeddings_cpu", tmp_path)
    report["runs"][1]["seed"] = "2"
    report["runs"][0]["aux_losses"] = {"loss_pos": [[10, 1.5], [20]]}
    with pytest.raises(CometNMTError, match=r'runs\[0\]\.aux_losses\.loss_pos\[1\] is a list \[20\], expected a \[step, loss\]'):
        render_report(_write(path, report))
    report["runs"][0]["aux_losses"] = {}
    with pytest.raises(CometNMTError, match=r'runs\[1\]\.seed is text "2", expected a whole number'):
        render_report(_write(path, report))

    report, path = _committed("multi30k_label_smoothing_cpu", tmp_path)  # reproduce's
    del report["examples"][3]["comet_bleu"]
    with pytest.raises(CometNMTError, match=r"examples\[3\]\.comet_bleu is missing"):
        render_report(_write(path, report))
    report, path = _committed("multi30k_label_smoothing_cpu", tmp_path)
    report["runs"][1]["history"][4].pop("val_bleu")  # the BLEU curve is drawn from every validation, as the first has it
    report["provenance"]["overrides"] = "train.lr=5e-4"
    with pytest.raises(CometNMTError, match=r'provenance\.overrides is text "train.lr=5e-4", expected a list or null'):
        render_report(_write(path, report))
    report["provenance"]["overrides"] = None
    with pytest.raises(CometNMTError, match=r"runs\[1\]\.history\[4\]\.val_bleu is missing"):
        render_report(_write(path, report))
    report["runs"][1]["history"][4]["val_bleu"] = 20.0
    report["candidate"] = "no_such_row"
    with pytest.raises(CometNMTError, match=r'candidate is text "no_such_row", expected a row of this commit'):
        render_report(_write(path, report))


def test_render_names_the_first_problem_in_the_file_s_order(tmp_path):
    """Of several problems, the first in the file is named, with how many more there are; a key its
    object lacks counts where the object ends, where a reader of the file finds it missing. It was
    jsonschema's first: an object's missing keys before its wrong-typed ones, and the keys in the
    schema's order, not the file's."""
    import pytest

    from cometnmt.errors import CometNMTError
    from cometnmt.render import render_report

    report, path = _committed("tie_embeddings_cpu", tmp_path)  # compare's: runs last in the file, significance before it
    report["runs"][0]["seed"] = "1"  # seed stands before command in the run
    command = report["runs"][0].pop("command")
    with pytest.raises(CometNMTError, match=r'runs\[0\]\.seed is text "1", expected a whole number \(and 1 more key after it\)'):
        render_report(_write(path, report))
    report["runs"][0]["command"] = command
    report["significance"][0]["p_value"] = "0.006"  # in the schema after runs
    with pytest.raises(CometNMTError, match=r'significance\[0\]\.p_value is text "0.006", expected a number \(and 1 more key after it\)'):
        render_report(_write(path, report))
    del report["table"][0]["seeds"]
    with pytest.raises(CometNMTError, match=r"table\[0\]\.seeds is missing \(and 2 more keys after it\)"):
        render_report(_write(path, report))


def test_render_refuses_a_run_command_no_shell_splits(cli, tmp_path):
    """A run's recorded command with an unbalanced quote (a hand-edited report.json) made shlex.split,
    which shortens the command for report.md and reads its overrides, raise a ValueError: a traceback.
    It is refused as any value render cannot draw, naming the file and the key; not shown as written,
    since report.md would give as the run's a command no shell runs."""
    report, path = _committed("multi30k_label_smoothing_cpu", tmp_path)
    report["runs"][1]["command"] += " --set 'train.lr=5e-4"
    proc = cli("render", str(_write(path, report)), check=False)
    assert proc.returncode == 2 and f"{path}: runs[1].command is text " in proc.stderr, proc.stderr
    assert "expected a shell command (No closing quotation)" in proc.stderr and "Traceback" not in proc.stderr
    assert not (path.parent / "report.md").exists()  # nothing drawn


def test_a_bug_of_the_renderer_is_raised_as_one_not_blamed_on_the_file(tmp_path, monkeypatch):
    """A KeyError or TypeError of render's own code, over a report.json that has all it needs,
    propagates as the bug it is; it was reported as the file lacking what this commit's report shows."""
    import pytest

    from cometnmt import compare, reproduce
    from cometnmt.render import render_report

    def broken(*args, **kwargs):
        raise KeyError("a key of our own code")

    report, path = _committed("tie_embeddings_cpu", tmp_path)
    monkeypatch.setattr(compare, "_curves", broken)
    with pytest.raises(KeyError, match="a key of our own code"):
        render_report(_write(path, report))
    report, path = _committed("multi30k_label_smoothing_cpu", tmp_path)
    monkeypatch.setattr(reproduce, "_learning_curves", lambda *a: [][0])  # IndexError
    with pytest.raises(IndexError):
        render_report(_write(path, report))
    monkeypatch.setattr(reproduce, "_learning_curves", lambda *a: None)
    monkeypatch.setattr(reproduce, "_markdown", lambda args, report: None + 1)  # TypeError
    with pytest.raises(TypeError):
        render_report(path)


def test_a_reproduce_report_of_a_row_this_commit_lacks_renders(tmp_path):
    """A reproduce report.json of a row this commit's Table 1 does not have (renamed or removed since)
    renders, the row named by its recorded label and row; its learning curve raised a KeyError."""
    from cometnmt.render import render_report

    report, path = _committed("multi30k_label_smoothing_cpu", tmp_path)
    for rec in report["table"] + report["runs"]:
        if rec["row"] == "transformer":
            rec["row"] = "transformer_of_old"
    text = render_report(_write(path, report)).read_text()
    assert "| Transformer | 1 |" in text and (path.parent / "learning_curves.png").stat().st_size > 0


def test_render_copies_report_json_byte_for_byte(tmp_path):
    """--out gets report.json's bytes as they are (copied, not decoded and written again as text):
    Windows line ends, non-ASCII text and no final newline kept."""
    from cometnmt.render import render_report

    report, path = _committed("tie_embeddings_cpu", tmp_path)
    report["provenance"]["command"] += " # Übersetzung → 翻訳"
    raw = json.dumps(report, indent=1, ensure_ascii=False).replace("\n", "\r\n").encode("utf-8")
    path.parent.mkdir(parents=True)
    path.write_bytes(raw)
    render_report(path, tmp_path / "other")
    assert (tmp_path / "other" / "report.json").read_bytes() == raw


def test_every_committed_report_renders_as_committed_from_any_folder(tmp_path, monkeypatch):
    """The runs' commands in report.md come from report.json alone, not from the folder render runs
    in: a preset recorded absolute (/work/main/configs/multi30k/comet.yaml in multi30k_table1) was
    shown relative to the current folder, configs/multi30k/comet.yaml from /work/main only, and
    work/main/configs/... from the root. Rendered from the root (above every recorded path) and from
    another folder, every committed report is its committed report.md but for the re-rendered line."""
    from cometnmt.render import render_report

    found = sorted((REPO / "reports").glob("*/report.json"))
    assert len(found) >= 7
    for path in found:
        committed = _without_rendered_line((path.parent / "report.md").read_text(encoding="utf-8"))
        for where in (Path(tmp_path.anchor), tmp_path):
            monkeypatch.chdir(where)
            text = render_report(path, tmp_path / "rendered" / path.parent.name).read_text(encoding="utf-8")
            assert _without_rendered_line(text) == committed, (path.parent.name, str(where))


def test_every_committed_report_can_be_re_rendered_or_says_it_cannot():
    """A committed reproduce or compare report (its provenance line '- commit (report):') is a
    report.md beside its report.json, which `cometnmt render` rewrites; any other says at its top
    that it is a one-off document and why (report_mixed_batches_first.md's report.json was never
    committed, and nothing it was made from is)."""
    for md in sorted((REPO / "reports").glob("*/*.md")):
        text = md.read_text(encoding="utf-8")
        if "\n- commit (report): " not in text:
            continue  # a README or a script's write-up, not a report render writes
        if md.name == "report.md":
            assert (md.parent / "report.json").is_file(), md
        else:
            head = text.split("\n- commit (report): ")[0]
            assert "one-off document" in head and "`cometnmt render`" in head, md


class _Read(dict):
    """A report.json object (as render hands it to a renderer) that records in ``seen`` the key path
    of every key read from it, by [], .get, in, iteration or .items(); a list's items are ``[]``."""

    def __init__(self, value: dict, at: tuple, seen: set):
        super().__init__(value)
        self._at, self._seen = at, seen

    def _read(self, key):
        self._seen.add((*self._at, key))
        return _tracked(dict.__getitem__(self, key), (*self._at, key), self._seen)

    def __getitem__(self, key):
        return self._read(key)

    def get(self, key, default=None):
        self._seen.add((*self._at, key))
        return self._read(key) if dict.__contains__(self, key) else default

    def __contains__(self, key):
        self._seen.add((*self._at, key))
        return dict.__contains__(self, key)

    def __iter__(self):
        for key in dict.keys(self):
            self._seen.add((*self._at, key))
            yield key

    def keys(self):  # dict(x) and {**x} read every key through keys() and []
        return list(self)

    def items(self):
        return [(key, self._read(key)) for key in dict.keys(self)]

    def values(self):
        return [value for _, value in self.items()]


class _ReadList(list):
    def __init__(self, value: list, at: tuple, seen: set):
        super().__init__(value)
        self._at, self._seen = at, seen

    def __getitem__(self, index):
        item = list.__getitem__(self, index)
        return _ReadList(item, self._at, self._seen) if isinstance(index, slice) else _tracked(item, (*self._at, "[]"), self._seen)

    def __iter__(self):
        return (_tracked(item, (*self._at, "[]"), self._seen) for item in list.__iter__(self))


def _tracked(value, at: tuple, seen: set):
    return _Read(value, at, seen) if isinstance(value, dict) else _ReadList(value, at, seen) if isinstance(value, list) else value


def _branches(schema: dict):
    """``schema`` and, nested, its if's then and else."""
    yield schema
    for branch in ("then", "else"):
        if branch in schema:
            yield from _branches(schema[branch])


def _declared(schema: dict, keys: tuple) -> bool:
    """Whether ``schema`` declares the key path ``keys`` (``[]`` an array's items): in an object's
    properties or its map of any keys, or in those of an if's then or else."""
    if not keys:
        return True
    key = keys[0]
    for s in _branches(schema):
        if key == "[]":
            below = [s["items"]] if isinstance(s.get("items"), dict) else []
        elif key in s.get("properties", {}):
            below = [s["properties"][key]]
        else:
            below = [s["additionalProperties"]] if isinstance(s.get("additionalProperties"), dict) else []
        if any(_declared(b, keys[1:]) for b in below):
            return True
    return False


def test_every_key_a_renderer_reads_is_declared_in_its_schema(tmp_path, monkeypatch):
    """reproduce.render and compare.render read report.json keys all over (the provenance lines,
    the notes on capped runs, the learning curves): rendering every committed report.json with each
    key read recorded, every one is in the schema the shape check holds the file to. A key read but
    not declared would go unchecked: a file without it passes the check, and the renderer then fails
    with a KeyError (or draws a wrong-typed value) that render reports as a bug of its own."""
    from cometnmt import compare, reproduce
    from cometnmt.render import _compare_schema, _reproduce_schema, render_report

    seen = {compare: set(), reproduce: set()}
    for kind in seen:
        monkeypatch.setattr(kind, "render", lambda out, report, kind=kind, draw=kind.render:
                            draw(out, _Read(report, (), seen[kind])))
    found = sorted((REPO / "reports").glob("*/report.json"))
    for path in found:
        render_report(path, tmp_path / path.parent.name)
    assert seen[compare] and seen[reproduce], "no report of each kind was rendered"
    assert ("runs", "[]", "command") in seen[compare] and ("table", "[]", "label") in seen[reproduce]  # the tracking works
    for kind, schema in ((compare, _compare_schema()), (reproduce, _reproduce_schema())):
        # provenance.rendered is render's own line about this call, not the file's
        undeclared = sorted(".".join(keys).replace(".[]", "[]") for keys in seen[kind]
                            if keys[:2] != ("provenance", "rendered") and not _declared(schema, keys))
        assert not undeclared, f"{kind.__name__}.render reads keys its schema in cometnmt/render.py does not declare: {undeclared}"
