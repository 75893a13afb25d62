"""leaseguard redrive KEY [--id ID ...]: put the key's dead letters (all of them, or those
with these ids) back at the head of its queue, in the order they failed, with their attempts
reset, and resume the key if it was halted. On a key that an invocation holds, the owner runs
them next; on a free key, the next event for the key or the sweeper (leaseguard sweep) does.

It prints how many moved, as the backend's reply says: a request whose reply was lost and
that the client sent again is recognised (row V3) and reports what it moved. A redrive that
failed with a backend error may still have applied: leaseguard inspect KEY shows it.

Exit status 0 when it moved something and also when there was nothing to redrive (the key
holds no dead letters, or none with those ids; a redrive run again moves nothing), which it
says; 1 when the backend failed, 2 for bad arguments or configuration."""

from __future__ import annotations

import argparse
from typing import Any

from leaseguard.cli.backends import add_backend_arguments, build_provider, open_backend
from leaseguard.cli.text import quote


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "redrive",
        help="put a key's dead letters back at the head of its queue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("key", help="the lease key")
    parser.add_argument(
        "--id",
        dest="ids",
        action="append",
        metavar="ID",
        help="redrive only the dead letter with this signal id (repeat for more)",
    )
    add_backend_arguments(parser, embedded=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.ids is not None and not all(args.ids):
        parser.error("--id must not be empty")
    with open_backend(args, embedded=False) as (config, _):
        provider = build_provider(config)
        dead = {d.id for d in provider.inspect_key(args.key).dead_letters}
        moved = provider.redrive(args.key, args.ids)
        held = provider.get_lease_owner(args.key) is not None
    missing = sorted(set(args.ids or ()) - dead)
    if moved == 0:
        if args.ids:
            print(
                f"nothing to redrive: {quote(args.key)} holds no dead letter with id "
                f"{_ids(missing)}"
            )
        else:
            print(f"nothing to redrive: {quote(args.key)} holds no dead letters")
        return 0
    runner = "its owner runs them next" if held else "its next event or leaseguard sweep runs them"
    print(f"redrove {moved} dead letter(s) of {quote(args.key)} to the head of its queue; {runner}")
    if missing:
        print(f"not dead letters of {quote(args.key)}: {_ids(missing)}")
    return 0


def _ids(ids: list[str]) -> str:
    return ", ".join(quote(i) for i in ids)
