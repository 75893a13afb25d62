"""The Lua scripts, one named constant each, assembled once at import from
``leaseguard/providers/lua/*.lua``: the model's constants, the prelude's key names, the step's
fast path (if it has one), the prelude's helpers, then the rest of the step."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from leaseguard.protocol.model import DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS


@dataclass(frozen=True)
class LuaScript:
    """A script's text and SHA1, computed once at import; run by EVALSHA."""

    name: str
    text: str
    sha: str


# The model's constants, defined above the prelude of every script (one source of truth).
_CONSTANTS = (
    f"local DEDUPE_WINDOW_MS, DONE_LIMIT, TOKEN_MEMORY_MS = "
    f"{DEDUPE_WINDOW_MS}, {DONE_LIMIT}, {TOKEN_MEMORY_MS}\n"
)


# Splits the prelude into its key names and its helpers, and a step into its fast path and the
# rest: Lua builds a closure for every helper each time a script runs, so a step's common case
# goes between the two halves of the prelude and returns before any helper exists.
_HELPERS = re.compile(r"^-- @helpers\n", re.MULTILINE)


def _split(text: str, name: str) -> list[str]:
    """``text`` cut at its ``-- @helpers`` line: one part (it has none) or two."""
    parts = _HELPERS.split(text)
    if len(parts) > 2:
        raise ValueError(f"{name}.lua: more than one '-- @helpers' line")
    return parts


_LUA_DIR = resources.files("leaseguard.providers") / "lua"


def _lua(name: str) -> LuaScript:
    prelude = _split((_LUA_DIR / "_prelude.lua").read_text(encoding="utf-8"), "_prelude")
    if len(prelude) != 2:
        raise ValueError("_prelude.lua: no '-- @helpers' line after the key names")
    step = _split((_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8"), name)
    fast, rest = step if len(step) == 2 else ("", step[0])
    return _script(name, _CONSTANTS + prelude[0] + fast + prelude[1] + "\n" + rest)


def _plain_lua(name: str) -> LuaScript:
    """A script that is no protocol step: its own text only (its first line may be a shebang,
    which must stay first)."""
    return _script(name, (_LUA_DIR / f"{name}.lua").read_text("utf-8"))


def _script(name: str, text: str) -> LuaScript:
    return LuaScript(name, text, hashlib.sha1(text.encode("utf-8")).hexdigest())


ACQUIRE_LUA = _lua("acquire")
RENEW_LUA = _lua("renew")
RELEASE_LUA = _lua("release")
TRANSFER_LUA = _lua("transfer")
ACQUIRE_OR_ENQUEUE_LUA = _lua("acquire_or_enqueue")
TAKE_SIGNALS_LUA = _lua("take_signals")
TRANSFER_TO_NEXT_LUA = _lua("transfer_to_next")
CLAIM_SIGNAL_LUA = _lua("claim_signal")
ADOPT_LUA = _lua("adopt")
INSPECT_LUA = _lua("inspect")
REDRIVE_LUA = _lua("redrive")
SCAN_SLOT_INDEXES_LUA = _plain_lua("scan_slot_indexes")  # Cluster only, Redis 7+

SCRIPTS = (
    ACQUIRE_LUA,
    RENEW_LUA,
    RELEASE_LUA,
    TRANSFER_LUA,
    ACQUIRE_OR_ENQUEUE_LUA,
    TAKE_SIGNALS_LUA,
    TRANSFER_TO_NEXT_LUA,
    CLAIM_SIGNAL_LUA,
    ADOPT_LUA,
    INSPECT_LUA,
    REDRIVE_LUA,
    SCAN_SLOT_INDEXES_LUA,
)

ACL_COMMANDS: tuple[str, ...] = tuple(
    sorted(
        {"evalsha", "script|load", "hget", "llen", "zrange", "zrangebyscore"}
        | {m.lower() for lua in SCRIPTS for m in re.findall(r"redis\.call\('(\w+)'", lua.text)}
    )
)
"""Every command leaseguard sends or runs inside its scripts (which run with the caller's ACL
permissions): a least-privilege Redis user needs exactly these, on keys ``<prefix>*``::

    ACL SETUSER lease-app on >password ~lg:* resetchannels -@all +<each command>
"""

REPLICA_ACL_COMMANDS: tuple[str, ...] = ("set", "wait")
"""What ``RedisLeaseProvider(..., replicas=N)`` sends besides :data:`ACL_COMMANDS`: the fence
``SET`` (on ``<prefix>*`` keys) and ``WAIT``."""
