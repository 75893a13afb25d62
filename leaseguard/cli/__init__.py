"""The leaseguard command: one module per subcommand.

=============  ==================================================================
simulate       many concurrent guarded invocations across processes, verified
inspect        holder, token, TTL, queued signals, dead letters of a key
dead-letters   the keys that hold dead letters, with their counts
redrive        put a key's dead letters back at the head of its queue
sweep          one sweeper pass: adopt orphaned keys and dispatch their signals
invoke         run a handler locally with a Lambda-like context (no Docker)
create-table   create the DynamoDB table (idempotent)
=============  ==================================================================

Every failure is one line on stderr, "leaseguard COMMAND: error: what failed: what to do",
with exit status 2 for a usage or configuration error (bad arguments, no backend configured,
a bad URL, missing AWS credentials, a missing table, an extra not installed: "install
leaseguard[cli]") and 1 for a backend that failed or could
not be reached. LEASEGUARD_DEBUG=1 prints the traceback as well.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from leaseguard import __version__

MAX_MESSAGE_CHARS = 600


def debugging() -> bool:
    return os.environ.get("LEASEGUARD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str) -> str:
    """``text`` on one line (whitespace runs become one space), cut to a readable length, with
    every other non-printable character escaped (:mod:`leaseguard.cli.text`): a key or an
    exception's text in a message cannot start a line or reach the terminal as a control."""
    from leaseguard.cli.text import escape

    line = " ".join(str(text).split())
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 3] + "..."
    return escape(line)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line: what is wrong, and where help is."""

    def error(self, message: str) -> NoReturn:
        if debugging():
            self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from leaseguard.cli import (
        create_table_cmd,
        dead_letters_cmd,
        inspect_cmd,
        invoke_cmd,
        redrive_cmd,
        simulate_cmd,
        sweep_cmd,
    )

    parser = Parser(
        prog="leaseguard",
        description="One owner per key across concurrent AWS Lambda invocations.",
    )
    parser.add_argument("--version", action="version", version=f"leaseguard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        simulate_cmd,
        inspect_cmd,
        dead_letters_cmd,
        redrive_cmd,
        sweep_cmd,
        invoke_cmd,
        create_table_cmd,
    ):
        module.register(commands)
    for sub in commands.choices.values():
        # A subcommand's own parser, so that its usage errors name it ("leaseguard sweep: ...").
        sub.set_defaults(command_parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args, args.command_parser)
    except KeyboardInterrupt:
        print(f"leaseguard {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure becomes one line (the traceback on request)
        return fail(args, exc)
    return code


def fail(args: argparse.Namespace, exc: BaseException) -> int:
    """Report ``exc`` as one line on stderr and return the exit status it calls for."""
    from leaseguard.cli.backends import explain
    from leaseguard.errors import LeaseguardError, MissingExtra, extra_of

    if debugging():
        traceback.print_exception(exc)
    if isinstance(exc, ModuleNotFoundError) and not isinstance(exc, MissingExtra):
        extra = extra_of(exc.name)
        if extra is not None:  # an optional import outside extra_required: still name the fix
            exc = MissingExtra(extra, str(exc.name).split(".")[0], f"leaseguard {args.command}")
    known = isinstance(exc, LeaseguardError) or type(exc).__module__.split(".")[0] in (
        "redis",
        "botocore",
        "boto3",
    )
    if known:
        message, code = explain(exc, getattr(args, "backend_config", None), args.command)
    else:  # a bug, most likely: its type and text are all there is to go on
        message, code = (
            f"unexpected {type(exc).__name__}: {exc} (LEASEGUARD_DEBUG=1 shows the traceback)",
            1,
        )
    print(f"leaseguard {args.command}: error: {one_line(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
