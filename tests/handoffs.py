"""A Lambda client that records the guard's hand-offs (async ``Invoke`` of the function) instead
of making them, and delivers them the way Lambda would: by calling the handler again with the
envelope as its event."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from leaseguard.testing import LambdaContext


class RecordingLambda:
    """``lambda_client=`` for a guarded handler: each hand-off is kept in :attr:`invokes`."""

    def __init__(self) -> None:
        self.invokes: list[dict[str, Any]] = []
        self.delivered = 0

    def invoke(self, **params: Any) -> dict[str, Any]:
        assert params["InvocationType"] == "Event", params  # a hand-off never waits
        self.invokes.append(params)
        return {"StatusCode": 202}

    def pending(self) -> list[dict[str, Any]]:
        """The envelopes sent and not delivered yet."""
        return [json.loads(p["Payload"]) for p in self.invokes[self.delivered :]]

    def deliver(self, handler: Callable[[Any, Any], Any]) -> list[Any]:
        """Run every pending envelope (and those the runs send) in a new invocation each, in
        the order they were sent; their answers."""
        answers = []
        while self.delivered < len(self.invokes):
            envelope = json.loads(self.invokes[self.delivered]["Payload"])
            self.delivered += 1
            answers.append(handler(envelope, LambdaContext()))
        return answers
