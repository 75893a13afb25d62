"""A Redis failover, as the explorer's fault: the primary dies and a replica that lacks its
last write on a key takes over.

With ``RedisLeaseProvider(..., replicas=N)`` every write is acknowledged only once ``WAIT``
reports it on N replicas (docs/safety.md, section 4), so a replica promoted to primary holds
every write whose reply a caller received. What a failover can lose is a write whose reply no
caller has yet: the caller then sees an error (``NotReplicated``, or the connection's), as a
caller that gave up does, but the write is gone instead of applied. Replication is ordered, so
only the last write on a key can be lost this way while later ones survive: the explorer keeps,
per key, the record as it was before its last write and who made it, and a failover restores it
and answers that caller with an error.

Without ``replicas`` a failover may also lose a write whose reply was delivered: an accepted
forward, a grant its owner runs under (issue 23 finding 5). The mutant ``failover-without-wait``
(a model whose ``failover_keeps_acknowledged`` is false) lets the explorer do that, and must be
caught.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from .state import KeyRecord

if TYPE_CHECKING:
    from .world import Book, World

# What a write adds to the history the invariants keep, which a failover that loses the write
# takes back: ids (queued, reported done, taken unseen) and per-event counts (l)
_ID_FIELDS = ("enqueued", "reported", "ambiguous")
_COUNT_FIELDS = ("starts", "charges")


class LastWrite(NamedTuple):
    """The last write on one key: the record before it, its caller and call."""

    before: KeyRecord  # never changed once kept: a failover restores a clone
    aid: str
    nonce: str
    acknowledged: bool  # its reply reached the caller
    book_before: Book  # the history before and after the write's own bookkeeping
    book_after: Book


def kept(w: World, index: int, before: KeyRecord, aid: str, nonce: str, book_before: Book) -> None:
    """A write on key ``index`` applied; ``before`` is the record it changed and
    ``book_before`` the history before it (``w.book`` is the history after it)."""
    undo = list(w.undo)
    undo[index] = LastWrite(before, aid, nonce, False, book_before, w.book)
    w.undo = tuple(undo)


def acknowledged(w: World, nonce: str) -> None:
    """The reply of call ``nonce`` reached its caller."""
    w.undo = tuple(
        last._replace(acknowledged=True) if last is not None and last.nonce == nonce else last
        for last in w.undo
    )


def forget(w: World, index: int) -> None:
    """A write nobody waits on (the operator's): the last write is no longer one to lose."""
    undo = list(w.undo)
    undo[index] = None
    w.undo = tuple(undo)


def failovers(w: World, keep_acknowledged: bool) -> Iterator[tuple[int, LastWrite]]:
    """The keys whose last write a failover may lose now."""
    for index, last in enumerate(w.undo):
        if last is not None and not (keep_acknowledged and last.acknowledged):
            yield index, last


def restore(w: World, index: int, last: LastWrite) -> None:
    """The promoted replica's record: as before the lost write, and the history without what
    that write added (a forward it queued was never accepted, a success it reported was not
    reported, an attempt it charged was not charged)."""
    w.recs[index] = last.before.clone()
    book, before, after = w.book, last.book_before, last.book_after
    changes: dict[str, Any] = {}
    for name in _ID_FIELDS:
        added = set(getattr(after, name)) - set(getattr(before, name))
        changes[name] = tuple(x for x in getattr(book, name) if x not in added)
    for name in _COUNT_FIELDS:
        changes[name] = tuple(
            max(now - (late - early), 0)
            for now, early, late in zip(
                getattr(book, name), getattr(before, name), getattr(after, name), strict=True
            )
        )
    w.book = book._replace(**changes)
    forget(w, index)
