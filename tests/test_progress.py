"""Progress bars: a terminal gets tqdm's redraws; a log file gets few."""

import io

from cometnmt.progress import LOG_FILE_INTERVAL, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_file_gets_few_redraws_a_terminal_all(monkeypatch):
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    log = io.StringIO()
    with progress_bar(total=10_000, file=log) as bar:
        assert bar.mininterval == LOG_FILE_INTERVAL
        for _ in range(10_000):
            bar.update(1)
    assert log.getvalue().count("\r") <= 3  # the first frame, the last, and perhaps one between
    assert "10000/10000" in log.getvalue()
    with progress_bar(total=3, file=Terminal()) as bar:
        assert bar.mininterval == 0.1  # tqdm's own


def test_the_interval_can_be_set():
    """tqdm reads TQDM_MININTERVAL when it is imported: a fresh process."""
    import os
    import subprocess
    import sys

    code = "import io; from cometnmt.progress import progress_bar; print(progress_bar(file=io.StringIO()).mininterval)"
    env = {**os.environ, "TQDM_MININTERVAL": "2"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "2.0"
    with progress_bar(total=3, file=io.StringIO(), mininterval=5) as bar:
        assert bar.mininterval == 5


def test_tqdms_monitor_thread_does_not_redraw_a_log_file_sooner(monkeypatch):
    """tqdm's monitor thread redraws a bar whose last frame is `maxinterval` (10 s) old: with the
    30 s minimum a training log got a frame every 10-20 s. The maximum now follows the minimum."""
    monkeypatch.delenv("TQDM_MININTERVAL", raising=False)
    monkeypatch.delenv("TQDM_MAXINTERVAL", raising=False)
    with progress_bar(total=3, file=io.StringIO()) as bar:
        assert bar.maxinterval >= bar.mininterval == LOG_FILE_INTERVAL
    with progress_bar(total=3, file=io.StringIO(), mininterval=60) as bar:
        assert bar.maxinterval == 60
    with progress_bar(total=3, file=io.StringIO(), mininterval=5, maxinterval=7) as bar:
        assert bar.maxinterval == 7  # the caller's
    with progress_bar(total=3, file=Terminal()) as bar:
        assert bar.maxinterval == 10  # tqdm's own
    monkeypatch.setenv("TQDM_MININTERVAL", "45")  # tqdm reads it at import; the maximum follows it here
    with progress_bar(total=3, file=io.StringIO()) as bar:
        assert bar.maxinterval == 45
