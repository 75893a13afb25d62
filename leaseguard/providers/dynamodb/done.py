"""The completed-id memory ``d`` of the lease item ([G2] [G6]) and how it is read.

``d`` is a list of batches, each the ids one completion finished (S) followed by its marker
``±(at * 10**20 + token)`` (N): positive when the completion succeeded. A failed owner's entry
is nested (L[S] or L[S, N], N its failed runs so far) so that ``contains(#d, :me)`` only
matches ids to deduplicate, and when N > 0 it is followed by a B element, its resume tag.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DONE_LIMIT

# A completion marker in ``d`` is ``±(at * _MARK + token)``.
_MARK = 10**20
# Besides DONE_LIMIT ids, at most this many bytes of ids are remembered (ids may be 1 KiB each;
# the lease item, which every write pays for, must stay far below DynamoDB's 400 KB).
DONE_BYTES = 64 * 1024
# A completer prunes forgotten entries from the head of ``d`` once this many have piled up.
PRUNE_MIN = 64
_PRUNE_MAX = 128  # elements per prune write (an UpdateExpression is limited to 4 KB)


@dataclass(frozen=True)
class Done:
    """One remembered completion ([G6]): the grant's token (0 when the completing call named
    none), when, whether it succeeded (a failed one is not deduplicated) and, for a failed
    own event, its failed runs so far (its platform retry resumes them: [Q1] [Q2] [Q6] [Q9])."""

    token: int
    at: int
    ok: bool
    attempts: int = 0


def marker(at: int, token: int, ok: bool) -> int:
    value = at * _MARK + token
    return value if ok else -value


def done_view(elements: Sequence[Mapping[str, Any]], now: int) -> dict[str, Done]:
    """[G2] The completed ids the model remembers at ``now``, oldest first.

    ``d`` is a list of batches, each the ids one completion finished (S) followed by its marker
    (N, see :func:`marker`). A later batch naming an id again replaces the earlier entry (as
    ``remember_done`` does); entries older than the dedupe window, and the oldest beyond
    DONE_LIMIT ids or DONE_BYTES bytes of ids, are forgotten even while still stored.
    """
    view: dict[str, Done] = {}
    batch: list[tuple[str, int]] = []
    for element in elements:
        sid = _element_id(element)
        if sid is not None:
            batch.append((sid, _element_attempts(element)))
        elif "N" in element:
            value = int(element["N"])
            token, at, ok = abs(value) % _MARK, abs(value) // _MARK, value > 0
            for sid, attempts in batch:
                view.pop(sid, None)
                view[sid] = Done(token, at, ok, 0 if ok else attempts)
            batch = []
    horizon = now - DEDUPE_WINDOW_MS
    ids = [sid for sid, done in view.items() if done.at > horizon]
    start, size = len(ids), 0
    while start > 0 and len(ids) - start < DONE_LIMIT:
        size += len(ids[start - 1].encode("utf-8")) + 1
        if size > DONE_BYTES:
            break
        start -= 1
    return {sid: view[sid] for sid in ids[start:]}


def _element_id(element: Mapping[str, Any]) -> str | None:
    """The id an element of ``d`` names: S for a completed id, L[S] or L[S, N] for an owner
    whose run failed (nested, so that ``contains(#d, :me)`` only matches ids to deduplicate;
    the N is its failed runs so far). A B element (:func:`resume_tag`) names no entry."""
    if "S" in element:
        return str(element["S"])
    if "L" in element and element["L"] and "S" in element["L"][0]:
        return str(element["L"][0]["S"])
    return None


def _element_attempts(element: Mapping[str, Any]) -> int:
    """The failed runs a failed owner's element (L[S, N]) carries; 0 for any other."""
    nested = element.get("L")
    if nested and len(nested) > 1 and "N" in nested[1]:
        return int(nested[1]["N"])
    return 0


def resume_tag(signal_id: str) -> bytes:
    """The B element that follows a failed owner's L[S, N] element in ``d`` when N > 0: a
    scalar that the blind [Q1] / [Q2] writes can refuse on (``NOT contains(#d, :tag)``), since
    a signal stored anew with that id resumes the count and needs the snapshot-based write. A
    B value never equals an id (S) or a marker (N)."""
    return signal_id.encode("utf-8")


def prunable(elements: Sequence[Mapping[str, Any]], view: Mapping[str, Done]) -> int:
    """How many leading elements of ``d`` (whole batches, at most _PRUNE_MAX) hold nothing the
    view still needs: a batch whose ids were all forgotten or named again by a later batch."""
    final: dict[str, int] = {}
    for i, element in enumerate(elements):
        sid = _element_id(element)
        if sid is not None:
            final[sid] = i
    needed = {final[sid] for sid in view if sid in final}
    cut = 0
    for i, element in enumerate(elements[:_PRUNE_MAX]):
        if i in needed:
            break
        if "N" in element:
            cut = i + 1
    return cut
