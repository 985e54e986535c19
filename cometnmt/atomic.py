"""One way to write a file whole or not at all: a temporary file beside it, flushed and fsync'd,
then renamed over it (``os.replace``). Checkpoints, outputs, JSON results, tag caches and
downloads all go through ``atomic_write``, so an interrupted write never leaves a torn file."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` (``mode`` "w": UTF-8 text, "wb": bytes; parent
    folders created). On a normal exit it replaces ``path``, readable by all (0644, as an ordinary
    file); on an exception it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
