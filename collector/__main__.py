"""`python -m collector`: a stop signal while the CLI is still being imported is told as the
CLI tells later ones (one line, 128 + signal; helper-141: a traceback, or nothing)."""

import signal
import sys


def _stopped_while_starting(signum: int, _frame: object) -> None:
    print(f"collector: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
    sys.exit(128 + signum)


for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _stopped_while_starting)

from collector.cli import main  # noqa: E402  (after the handlers: the import takes a while)

sys.exit(main())
