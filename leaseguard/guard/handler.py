"""One guarded handler: its key function, provider, options, hand-off policy and telemetry."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

from leaseguard import config
from leaseguard.errors import ConfigurationError, HandlerKeyError, InvalidLeaseArgument
from leaseguard.events import as_json
from leaseguard.observability import Telemetry
from leaseguard.renewer import LeaseRenewer
from leaseguard.stacking import check_handler_stack
from leaseguard.types import QueueProvider, is_lease_provider, is_signal_queue
from leaseguard.validation import check_key

from .failures import FailureReporter
from .options import GuardOptions
from .policy import HandoffPolicy


class GuardedHandler:
    """What ``@lease_owned`` knows about the handler it wraps (``wrapper.__leaseguard__``).

    ``clock`` (seconds, monotonic) and ``renewer_class`` are the flow's time and its renewal
    thread: the model checker (:mod:`leaseguard.protocol.guarded`) sets both, so that it runs
    this handler's own flow with time and renewals where its search puts them.
    """

    def __init__(
        self,
        handler: Callable[..., Any],
        key_fn: Callable[[Any], str] | str,
        provider: object | None,
        options: GuardOptions,
        telemetry: Telemetry,
    ) -> None:
        self.name = getattr(handler, "__qualname__", repr(handler))
        self.key_fn = compile_key_fn(key_fn, self.name)
        if provider is not None and not (is_lease_provider(provider) and is_signal_queue(provider)):
            raise ConfigurationError(
                f"@lease_owned on {self.name}: provider must implement the lease contract and "
                f"the signal queue, got {type(provider).__name__}"
            )
        self._provider = cast("QueueProvider | None", provider)
        self.options = options
        self.telemetry = telemetry
        self.policy = HandoffPolicy(options)
        self.failures = FailureReporter(options, telemetry)
        self.warned_no_context = False
        self.clock: Callable[[], float] = time.monotonic
        self.renewer_class: type[LeaseRenewer] = LeaseRenewer
        check_handler_stack(handler, self.name)  # Powertools decorators that must be outside

    @property
    def provider(self) -> QueueProvider:
        """The provider given as ``provider=``, else the environment's, resolved on each use
        through :data:`leaseguard.config.provider_from_env` (built on first use, not at import:
        tests and local runs set the environment first). A test's
        :func:`leaseguard.testing.use_provider` takes the place of either."""
        override = config.provider_override()
        if override is not None:
            return cast("QueueProvider", override)
        if self._provider is not None:
            return self._provider
        return cast("QueueProvider", config.provider_from_env())

    def key_of(self, event: Any) -> str:
        try:
            key = self.key_fn(event)
        except HandlerKeyError:
            raise
        except Exception as exc:
            raise HandlerKeyError(
                f"key function of {self.name} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(key, str) or not key:
            raise HandlerKeyError(
                f"key function of {self.name} returned {type(key).__name__} {key!r}; "
                "it must return a non-empty str"
            )
        try:
            return check_key(key)
        except InvalidLeaseArgument as exc:
            raise HandlerKeyError(f"key function of {self.name}: {exc}") from exc

    def warn_without_context(self) -> None:
        """Once per handler: with no Lambda context the owner cannot see the deadline, so it
        would drain its whole queue inline, however long that takes."""
        if self.options.handoff.mode == "inline" or self.warned_no_context:
            return
        self.warned_no_context = True
        self.telemetry.log(
            logging.WARNING,
            f"{self.name} was called without a Lambda context: the owner cannot see the "
            "deadline and hands off inline only. Pass the context, or decorate the "
            "lambda_handler with leaseguard.batch.handle_envelopes",
        )


def compile_key_fn(key_fn: Callable[[Any], str] | str, name: str) -> Callable[[Any], Any]:
    """``key_fn`` itself, or the search of a JMESPath expression on the event."""
    if callable(key_fn):
        return key_fn
    if not isinstance(key_fn, str) or not key_fn:
        raise ConfigurationError(
            f"@lease_owned on {name}: key_fn must be a callable or a JMESPath string"
        )
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        expression = jmespath.compile(key_fn)
    except JMESPathError as exc:
        raise ConfigurationError(f"@lease_owned on {name}: bad JMESPath {key_fn!r}: {exc}") from exc

    def search(event: Any) -> Any:
        found = expression.search(as_json(event))
        if found is None:
            raise HandlerKeyError(f"key function of {name}: nothing at {key_fn!r} in the event")
        return found

    return search
