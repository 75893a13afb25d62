"""A stand-in for the context object AWS Lambda passes to a handler."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass
class LambdaContext:
    """Request id, deadline and function ARN, like ``sam local invoke`` gives a handler.

    ``get_remaining_time_in_millis()`` counts down from ``timeout_ms`` in real time, so code
    that checks the deadline behaves as it would on Lambda.
    """

    function_name: str = "leaseguard-local"
    timeout_ms: int = 30_000
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    region: str = "us-east-1"
    account_id: str = "123456789012"
    memory_limit_in_mb: int = 128
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""
    started_at: float = field(default_factory=time.monotonic)

    function_arn: str | None = None

    @property
    def invoked_function_arn(self) -> str:
        """``function_arn`` when given (``""`` stands for a context that names no function, so
        a guarded handler hands off inline), else an ARN built from the other fields."""
        if self.function_arn is not None:
            return self.function_arn
        return f"arn:aws:lambda:{self.region}:{self.account_id}:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        elapsed_ms = int((time.monotonic() - self.started_at) * 1000)
        return max(self.timeout_ms - elapsed_ms, 0)
