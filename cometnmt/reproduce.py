"""`cometnmt reproduce`: written in the COMET issue (see below)."""


def add_arguments(parser) -> None:
    parser.add_argument("--rows", nargs="*", default=[])


def run_reproduce(args) -> int:
    from cometnmt.errors import CometNMTError

    raise CometNMTError("reproduce is not built yet")
