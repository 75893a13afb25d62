"""The operator's steps of the protocol (rows V* of docs/protocol.md): part of
:class:`~leaseguard.protocol.model.ProtocolModel`, kept apart by purpose."""

from __future__ import annotations

from leaseguard.types import KeyState

from .state import KeyRecord, Redriven, Stored


class OperatorSteps:
    """``redrive`` and ``inspect``; :class:`~leaseguard.protocol.model.ProtocolModel` gives
    them its shared pieces (``observe``, the dedupe window)."""

    dedupe_window_ms: int

    def observe(self, rec: KeyRecord, now: int) -> None:
        raise NotImplementedError  # ProtocolModel's [G1] [G2]

    def redrive(
        self, rec: KeyRecord, ids: tuple[str, ...] | None, now: int, nonce: str | None = None
    ) -> int:
        """[V1] Dead letters (all, or those named) go back to the head of the queue in the
        order they died, with no attempts counted, and a halted key resumes. A free key is
        then orphaned work: the next event or the sweeper runs it (D1, Q6). The call's
        ``nonce`` and how many it moved are remembered: [V3] a resend of it (its reply was
        lost) answers that count again and changes nothing. [V2] Nothing matches: nothing
        changes, 0. A call without a nonce is remembered by nobody (it cannot be resent)."""
        self.observe(rec, now)
        if nonce is not None and rec.redriven is not None and rec.redriven.nonce == nonce:
            return rec.redriven.moved  # [V3]
        moved = [d for d in rec.dead if ids is None or d.id in ids]
        if not moved:
            return 0
        rec.dead = [d for d in rec.dead if d not in moved]
        for d in moved:
            rec.stored[d.id] = Stored(d.record)
        rec.queue[0:0] = [d.id for d in moved]
        rec.halted = False
        if rec.owner is None:
            rec.expires = -1  # a past deadline: orphaned work as after an expiry, not a release
        if nonce is not None:
            rec.redriven = Redriven(nonce, len(moved), now)
        return len(moved)

    def inspect(self, rec: KeyRecord, key: str, now: int) -> KeyState:
        self.observe(rec, now)
        return rec.view(key, now)
