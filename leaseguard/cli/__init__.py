"""The ``leaseguard`` command: one module per subcommand.

=============  ==================================================================
``simulate``   many concurrent guarded invocations across processes, verified
``inspect``    holder, token, TTL and queued signals of a key
``sweep``      one sweeper pass: adopt orphaned keys and dispatch their signals
``invoke``     run a handler locally with a Lambda-like context (no Docker)
=============  ==================================================================
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from leaseguard import __version__


def build_parser() -> argparse.ArgumentParser:
    from leaseguard.cli import inspect_cmd, invoke_cmd, simulate_cmd, sweep_cmd

    parser = argparse.ArgumentParser(
        prog="leaseguard",
        description="One owner per key across concurrent AWS Lambda invocations.",
    )
    parser.add_argument("--version", action="version", version=f"leaseguard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (simulate_cmd, inspect_cmd, sweep_cmd, invoke_cmd):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.run(args, parser)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
