"""The command line's start (:func:`cometnmt.cli.main`), for ``python -m cometnmt`` and for the
installed ``cometnmt`` program alike (pyproject's ``[project.scripts]`` names :func:`main`).

The program named ``cometnmt.cli:main``, so its script imported cometnmt.cli (and what that needs,
some 0.2 s) before any SIGTERM handler was set: a SIGTERM then killed it without a word (exit -15),
while ``python -m cometnmt`` said it stopped. Both now set the handler here first; this module
imports nothing of cometnmt's but the package (whose ``__init__`` imports nothing heavy).
"""

import signal
import sys


def _terminated_while_starting(signum, frame):  # pragma: no cover - exercised by a subprocess
    """SIGTERM before cometnmt.cli.main handles it (while cometnmt.cli and what it needs are imported):
    the process died at once, exit 143 and no word. One line instead, then the same exit status."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    before = ", before serving" if command == "serve" else ""
    print(f"cometnmt{' ' + command if command else ''}: stopped (SIGTERM) while starting{before}", file=sys.stderr,
          flush=True)
    raise SystemExit(143)


def main() -> int:
    """Run the command line of ``sys.argv``, with SIGTERM said in one line from the start: the
    handler is set before cometnmt.cli is imported (the start-up it covers), and cometnmt.cli.main
    then sets its own. :func:`cometnmt.cli.main` stays the one to call in-process (it takes argv)."""
    previous = signal.signal(signal.SIGTERM, _terminated_while_starting)
    try:
        from cometnmt.cli import main as cli_main

        return cli_main()
    finally:  # cli.main put this handler back on leaving: a SIGTERM in the shutdown is no start-up's
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
