"""What one search covers: the bounds of the explored world, the named presets the CLI and
``make`` use.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Bounds:
    """How far a search looks: how many events, keys and faults, and the protocol's limits."""

    events: int = 3
    keys: int = 1
    faults: int = 2
    expiries: int = 1  # leases that may run out (each starts a take-over)
    ttl: int = 2
    platform_retries: int = 1
    takes: int = 1  # take_signals calls per run
    renews: int = 1  # renewals per run
    max_attempts: int = 2
    max_queue: int = 1000  # the forward bound (row Q8)
    halt: bool = False  # failures report on_poison="halt" (rows G6, N1, Q9, D4)
    redrives: int = 0  # operator redrives of a key's dead letters (row V1)
    drain_batch: int = 0  # the guard's drain_batch: owners run batches behind them (row G8)
    # the done memory's bound (ProtocolModel(done_limit=...)); None: DONE_LIMIT. A bound of 1
    # with two or three events overflows it, so a forgotten id's resend is explored (the
    # invariants (d) and (f) excuse a repeat or a "lost" whose id an eviction forgot)
    done_limit: int | None = None
    # the dead-letter bound (ProtocolModel(dead_limit=...)); None: DEAD_LIMIT. With a bound of 1
    # and a poison signal, a second failure finds no room (row G6: kept at the head, halted)
    dead_limit: int | None = None
    # the first ``poison`` events are poison: their handler raises on every run, without
    # taking a fault from the budget (so the faults left can fail another signal)
    poison: int = 0
    # Redis failovers that lose a key's last write (its reply not yet delivered, as with
    # replicas=N; the model's failover_keeps_acknowledged says which), each one fault
    failovers: bool = False
    # the guard's retry_delay_ms, in ticks (0: a failed signal runs again at once): its retry
    # waits on an unclaimed grant that runs out (the explorer's dispatcher sends nothing late)
    retry_delay: int = 0
    # the guard's caller_waits=True: every invocation's caller waits for its answer (an API
    # Gateway request), so an owner hands off everything behind its own event at once
    caller_waits: bool = False


PRESETS = {
    # make test: every fault kind, one at a time, over two events (about a minute), with the
    # guard's retry delay (a failed forwarded signal's retry waits on its grant running out)
    "small": Bounds(events=2, faults=1, expiries=1, renews=0, retry_delay=1),
    # make model-check: the same with renewals (a few minutes)
    "default": Bounds(events=2, faults=1, expiries=1, retry_delay=1),
    # by hand: three events and two faults (hours)
    "deep": Bounds(events=3, faults=2, expiries=1),
    # make test and make model-check: a bounded queue, a poison signal halting its key, and an
    # operator's redrive, over three events (a third forward meets a full queue)
    "queue": Bounds(
        events=3,
        faults=1,
        expiries=0,
        renews=0,
        takes=0,
        max_attempts=1,
        max_queue=1,
        halt=True,
        redrives=1,
        platform_retries=0,
    ),
}

# make test and make model-check: the guard's batch drain (drain_batch) behind a hand-off, over
# three events (the second is handed the key, the third runs in its batch), with a done memory
# of two ids, so the third completion overflows it and a forgotten id's resend or redelivery
# is explored (docs/safety.md, the dedupe window's rate)
PRESETS["drain"] = Bounds(
    events=3,
    faults=1,
    expiries=0,
    renews=0,
    takes=0,
    drain_batch=2,
    platform_retries=0,
    done_limit=2,
)

# make test and make model-check: owners whose caller waits (API Gateway) hand off whatever is
# queued behind their own event, whatever the deadline: the small bound's faults over the hand-off
# after every own run, and over an adopted chain that runs to the own event first
PRESETS["waiting"] = replace(PRESETS["small"], caller_waits=True)

# make test and make model-check: a Redis failover under replicas=N, over two events, with an
# expiry (the failover fault is the one fault)
PRESETS["failover"] = Bounds(events=2, faults=1, expiries=1, renews=0, takes=0, failovers=True)

# make test and make model-check: the dead-letter bound (row G6, invariant (n)), over two
# poison events: the first fills a dead-letter list of one, the second finds no room and waits
# at the head of the halted key, and the operator's redrive (its reply may be lost) frees the
# list: the redriven signal dies again, and the kept one is dead-lettered unrun in its place
PRESETS["dead"] = Bounds(
    events=2,
    faults=0,
    expiries=0,
    renews=0,
    takes=0,
    max_attempts=1,
    redrives=1,
    platform_retries=0,
    dead_limit=1,
    poison=2,
)
# make model-check: the same with one poison signal and one fault of any kind (the second
# failure is a handler raising, or any other fault meets a full dead-letter list)
PRESETS["dead-faults"] = replace(PRESETS["dead"], faults=1, poison=1)

# make model-check: the queue bounds with a platform retry of every refused or failed event
PRESETS["queue-retries"] = replace(PRESETS["queue"], platform_retries=1)
