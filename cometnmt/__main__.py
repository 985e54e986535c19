"""``python -m cometnmt``: the command line (:func:`cometnmt.cli.main`)."""

import signal
import sys


def _terminated_while_starting(signum, frame):  # pragma: no cover - exercised by a subprocess
    """SIGTERM before main() handles it (while cometnmt.cli and what it needs are imported): the
    process died at once, exit 143 and no word. One line instead, then the same exit status."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    before = ", before serving" if command == "serve" else ""
    print(f"cometnmt{' ' + command if command else ''}: stopped (SIGTERM) while starting{before}", file=sys.stderr,
          flush=True)
    raise SystemExit(143)


signal.signal(signal.SIGTERM, _terminated_while_starting)

from cometnmt.cli import main  # noqa: E402 (after the handler: this import is the start-up it covers)

raise SystemExit(main())
