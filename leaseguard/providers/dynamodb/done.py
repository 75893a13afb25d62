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

from .schema import value_bytes

# A completion marker in ``d`` is ``±(at * _MARK + token)``.
_MARK = 10**20
# Besides DONE_LIMIT ids, the remembered entries may take at most this many bytes of ``d`` as
# stored (by DynamoDB's rules: each entry's elements, its resume tag, and its batch's marker
# counted once per entry), the oldest forgotten first. Ids may be 1 KiB each; the lease item,
# which every write pays for, must stay far below DynamoDB's 400 KB.
DONE_BYTES = 64 * 1024
# A completion rewrites ``d`` as what it remembers (dropping what it forgot: past the window,
# beyond the limits, or named again by a later batch) as soon as at least this many elements,
# or this many bytes, of it are forgotten ([G2]); below that it only appends.
PRUNE_MIN = 64
GARBAGE_BYTES = 4 * 1024
DONE_STORED_BYTES = 3 + DONE_BYTES + GARBAGE_BYTES
"""The most ``d`` holds after any completion (its value's size by DynamoDB's rules): what is
remembered (at most DONE_BYTES) plus what is forgotten but not yet dropped (under
GARBAGE_BYTES), plus the list's overhead."""


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
    DONE_LIMIT ids or DONE_BYTES stored bytes (:func:`_entry_bytes`), are forgotten even
    while still stored.
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
        sid = ids[start - 1]
        size += _entry_bytes(sid, view[sid])
        if size > DONE_BYTES:
            break
        start -= 1
    return {sid: view[sid] for sid in ids[start:]}


def _entry_elements(sid: str, done: Done) -> list[dict[str, Any]]:
    """The elements of ``d`` that remember ``sid`` as ``done`` (without its batch's marker):
    S for a success; L[S] for a failed run, L[S, N] and its resume tag when N > 0."""
    if done.ok:
        return [{"S": sid}]
    if not done.attempts:
        return [{"L": [{"S": sid}]}]
    return [{"L": [{"S": sid}, {"N": str(done.attempts)}]}, {"B": resume_tag(sid)}]


def _marker_element(done: Done) -> dict[str, Any]:
    return {"N": str(marker(done.at, done.token, done.ok))}


def _stored_bytes(elements: Sequence[Mapping[str, Any]]) -> int:
    """The elements' share of ``d``'s size by DynamoDB's rules (1 byte each besides the
    value)."""
    return sum(1 + value_bytes(element) for element in elements)


def _entry_bytes(sid: str, done: Done) -> int:
    """What one remembered entry may take of ``d``: its elements and a marker of its own
    (entries of one batch share one, so the sum over a view bounds its compacted size)."""
    return _stored_bytes([*_entry_elements(sid, done), _marker_element(done)])


def compacted(view: Mapping[str, Done]) -> list[dict[str, Any]]:
    """[G2] ``d`` holding exactly ``view`` (oldest first): consecutive entries of one
    completion (same token, time and outcome) form a batch ended by its marker, so
    :func:`done_view` reads back the same view, and its size is at most
    ``3 + sum of _entry_bytes`` (at most 3 + DONE_BYTES)."""
    elements: list[dict[str, Any]] = []
    last: Done | None = None
    for sid, done in view.items():
        key = Done(done.token, done.at, done.ok)
        if last is not None and key != last:
            elements.append(_marker_element(last))
        elements += _entry_elements(sid, done)
        last = key
    if last is not None:
        elements.append(_marker_element(last))
    return elements


def rewrite(elements: Sequence[Mapping[str, Any]], now: int) -> list[dict[str, Any]] | None:
    """``d`` rewritten as what it remembers at ``now`` when at least PRUNE_MIN elements or
    GARBAGE_BYTES bytes of ``elements`` are forgotten; None when appending is cheaper. A
    single batch of any size is cut as needed (the view keeps only its newest ids)."""
    kept = compacted(done_view(elements, now))
    forgotten = len(elements) - len(kept)
    if forgotten <= 0:
        return None
    if forgotten < PRUNE_MIN and _stored_bytes(elements) - _stored_bytes(kept) < GARBAGE_BYTES:
        return None
    return kept


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


def plain(element: Mapping[str, Any]) -> object:
    """An element of ``d`` as the Python value a request's values name it by (the inverse of
    :func:`~leaseguard.providers.dynamodb.schema.attribute_value` for the shapes ``d`` holds)."""
    if "S" in element:
        return str(element["S"])
    if "N" in element:
        return int(element["N"])
    if "B" in element:
        return bytes(element["B"])
    return [plain(nested) for nested in element["L"]]
