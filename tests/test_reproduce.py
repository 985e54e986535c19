"""`cometnmt reproduce` end to end on a tiny setting: the report folder with the table beside the
paper's numbers, the bootstrap test, the Figure 4 PNG, learning curves and examples; a second call
skips the finished runs."""

from __future__ import annotations

import json

TINY = ["--set", "data.max_train_pairs=300", "--set", "data.max_valid_pairs=20", "--set", "train.max_epochs=1",
        "--set", "model.d_model=32", "--set", "model.n_heads=4", "--set", "model.d_ff=64", "--set", "model.enc_layers=1",
        "--set", "model.dec_layers=1", "--set", "train.num_threads=1", "--eval-limit", "30", "--bootstrap", "50"]


def test_reproduce_writes_the_report_and_skips_finished_runs(cli, tmp_path):
    out = tmp_path / "report"
    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--jobs", "2", "--out", str(out), *TINY)
    for name in ("report.md", "report.json", "figure4_bleu_by_length.png", "learning_curves.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    rows = {e["row"]: e for e in report["table"]}
    assert rows["comet"]["paper_test"] == 38.69 and rows["transformer"]["paper_dev"] == 38.33
    assert rows["comet"]["test_bleu"][0] is not None and rows["comet"]["seeds"] == [1]
    assert {s["metric"] for s in report["significance"]} == {"paper", "bleu"}
    assert len(report["examples"]) == 10 and {"source", "reference", "comet", "transformer"} <= set(report["examples"][0])
    text = (out / "report.md").read_text()
    assert "| COMET | 1 |" in text and "first 30 sentences" in text and report["provenance"]["hardware"]

    done = out / "runs" / "comet" / "seed1" / "done.json"
    stamp = done.stat().st_mtime_ns
    cli("reproduce", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), *TINY)
    assert done.stat().st_mtime_ns == stamp  # finished runs are not trained again

    # --merge-report: runs whose folders are gone come from an earlier report.json, with their
    # bootstrap rows and examples (their hypotheses are gone too); runs still in OUT/runs win
    import shutil

    prev = tmp_path / "prev.json"
    shutil.copy(out / "report.json", prev)
    shutil.rmtree(out / "runs" / "transformer")
    cli("reproduce", "--report-only", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out),
        "--merge-report", str(prev), *TINY)
    merged = json.loads((out / "report.json").read_text())
    assert merged["provenance"]["merged_runs"] == 1 and merged["provenance"]["missing_runs"] == []
    assert [e["test_paper_bleu"] for e in merged["table"]] == [e["test_paper_bleu"] for e in report["table"]]
    assert merged["significance"] == report["significance"] and merged["examples"] == report["examples"]
    assert [r.get("merged_from_report", False) for r in merged["runs"]] == [False, True]
    assert "taken from the earlier report" in (out / "report.md").read_text()
    # without it, the run is missing; a file that is not a report is named in the error
    cli("reproduce", "--report-only", "--rows", "comet", "transformer", "--seeds", "1", "--out", str(out), *TINY)
    assert json.loads((out / "report.json").read_text())["provenance"]["missing_runs"] == ["transformer seed 1"]
    (tmp_path / "bad.json").write_text('{"runs": [{"row": "comet"}]}')
    bad = cli("reproduce", "--report-only", "--rows", "comet", "--seeds", "1", "--out", str(out),
              "--merge-report", str(tmp_path / "bad.json"), check=False)
    assert bad.returncode != 0 and "bad.json is not a cometnmt reproduce report.json" in bad.stderr
