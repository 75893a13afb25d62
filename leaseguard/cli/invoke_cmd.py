"""leaseguard invoke MODULE:HANDLER --event FILE: run a handler locally, like
sam local invoke without Docker: a Lambda-like context (request id, deadline, function ARN),
the event from a JSON file, the result printed as JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any

from leaseguard.cli.text import escape
from leaseguard.testing.context import LambdaContext


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "invoke",
        help="run a handler locally with a Lambda-like context",
        description=__doc__,
    )
    parser.add_argument(
        "handler",
        metavar="MODULE:HANDLER",
        help="e.g. functions/thread_worker/app.py:handler or app:handler",
    )
    parser.add_argument(
        "--event", "-e", metavar="FILE", required=True, help="event JSON ('-' for stdin)"
    )
    parser.add_argument(
        "--timeout-ms", type=int, default=30_000, help="the function timeout (default 30000)"
    )
    parser.add_argument("--function-name", default=None, help="name in the context's ARN")
    parser.add_argument("--request-id", default=None, help="aws_request_id (default: a new UUID)")
    parser.add_argument(
        "--function-arn",
        default="",
        help="the context's invoked_function_arn; by default none, so a handoff runs inline "
        "here instead of invoking a function in AWS",
    )
    parser.set_defaults(run=run)


def load_handler(spec: str) -> Any:
    """``package.module:func``, or ``path/to/file.py:func`` (its folder goes on ``sys.path``
    first, as Lambda does with a function's code directory)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"handler must look like MODULE:FUNCTION, got {spec!r}")
    if target.endswith(".py") or "/" in target:
        path = Path(target if target.endswith(".py") else target + ".py").resolve()
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        sys.path.insert(0, str(path.parent))
        module_name = path.stem
    else:
        sys.path.insert(0, str(Path.cwd()))
        module_name = target
    module = importlib.import_module(module_name)
    handler = getattr(module, name, None)
    if not callable(handler):
        raise AttributeError(f"{module_name} has no callable {name!r}")
    return handler


def print_traceback(exc: BaseException) -> None:
    """The traceback on stderr, as Python prints it, except that an exception's message (a
    handler's, which may hold a key, a newline or an ANSI escape) is one escaped line."""
    for chunk in traceback.TracebackException.from_exception(exc).format():
        if chunk.startswith(("Traceback", "  File ")):  # the interpreter's own frame lines
            for line in chunk.rstrip("\n").split("\n"):
                print(escape(line), file=sys.stderr)
        elif chunk.startswith("\n"):  # "During handling of the above exception ..."
            print(f"\n{escape(chunk.strip())}\n", file=sys.stderr)
        else:  # "RuntimeError: message", or a note
            print(escape(chunk.removesuffix("\n")), file=sys.stderr)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.timeout_ms <= 0:
        parser.error("--timeout-ms must be positive")
    try:
        raw = (
            sys.stdin.read() if args.event == "-" else Path(args.event).read_text(encoding="utf-8")
        )
        event = json.loads(raw)
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read the event: {exc}")
    try:
        handler = load_handler(args.handler)
    except (ValueError, ImportError, AttributeError, FileNotFoundError) as exc:
        parser.error(str(exc))
    name = args.function_name or args.handler.rpartition(":")[0].replace("/", "-").removesuffix(
        ".py"
    )
    context = LambdaContext(
        function_name=name[-64:] or "local",
        timeout_ms=args.timeout_ms,
        aws_request_id=args.request_id or str(uuid.uuid4()),
        function_arn=args.function_arn,
    )
    try:
        result = handler(event, context)
    except Exception as exc:
        print_traceback(exc)
        return 1
    print(json.dumps(result, indent=2, default=str))
    return 0
