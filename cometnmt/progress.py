"""Progress bars (tqdm on stderr) that suit both a terminal and a log file."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

# Seconds between redraws where stderr is not a terminal (a log file, CI, `nohup`): tqdm's 0.1 s
# default writes up to ten frames a second into the log, megabytes over a long training.
LOG_FILE_INTERVAL = 30.0


def progress_bar(*args, **kwargs) -> tqdm:
    """A tqdm bar on stderr. In a terminal it redraws as tqdm does; into a file or pipe at most every
    :data:`LOG_FILE_INTERVAL` seconds (and once at the end), unless ``mininterval`` is given or the
    environment sets ``TQDM_MININTERVAL`` (tqdm's own variable). tqdm's ``maxinterval`` is raised
    to the minimum interval, so that its monitor thread does not redraw more often."""
    stream = kwargs.get("file") or sys.stderr
    if "mininterval" not in kwargs and "TQDM_MININTERVAL" not in os.environ and not _is_terminal(stream):
        kwargs["mininterval"] = LOG_FILE_INTERVAL
    minimum = kwargs.get("mininterval", os.environ.get("TQDM_MININTERVAL"))
    if minimum is not None and "maxinterval" not in kwargs and "TQDM_MAXINTERVAL" not in os.environ:
        # tqdm's monitor thread redraws a bar not drawn for `maxinterval` seconds (default 10): below
        # the minimum interval it drew a frame every 10-20 s into the log, not every 30 s
        try:
            kwargs["maxinterval"] = max(10.0, float(minimum))
        except ValueError:  # tqdm's own error names its variable
            pass
    return tqdm(*args, **kwargs)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
