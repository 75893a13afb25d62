"""How every command prints text it did not write: keys, signal ids, owners, error texts,
payloads, exception messages.

Keys and ids may hold any characters (``check_key``), and error texts are whatever a handler
raised, so printed raw they could forge a row of a table (a newline), rewrite the terminal
(``ESC [``, a carriage return) or reorder what it shows (U+202E). Every character that is not
printable (``str.isprintable``: C0 and C1 controls, DEL, line and paragraph separators, format
characters such as U+202E, lone surrogates, spaces other than U+0020) is written as the Python
escape that names it (``\\n``, ``\\x1b``, ``\\u202e``), and a backslash as ``\\\\``, so the
output is one line per value, nothing in it reaches the terminal as a control, and the text can
be read back exactly. ``--json`` output needs none of this: ``json.dumps`` escapes every
non-ASCII character.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

_PLAIN_EXTRA = frozenset("'\"\\")


def escape(text: str) -> str:
    """``text`` with its non-printable characters and backslashes as escapes (free text: an
    error message, a traceback line); printable text comes back unchanged."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(_escape_char(char) for char in text)


def _escape_char(char: str) -> str:
    if char == "\\":
        return "\\\\"
    if char.isprintable():
        return char
    return repr(char)[1:-1]  # \n, \r, \t, \xhh, \uhhhh or \Uhhhhhhhh


def quote(text: str) -> str:
    """An identifier inside a sentence: always quoted, escaped, as a Python string literal
    (``'thread:9'``, ``'a\\nb'``)."""
    return "'" + escape(text).replace("'", "\\'") + "'"


def word(text: str) -> str:
    """An identifier in a column or a list: bare when it is plain (printable, no quote,
    backslash or edge space, not empty), else :func:`quote`-d, so a bare word is always the
    exact value and a quoted one is always an escape."""
    plain = (
        bool(text)
        and text.isprintable()
        and text == text.strip()
        and not _PLAIN_EXTRA.intersection(text)
    )
    return text if plain else quote(text)


def shell_word(text: str) -> str:
    """``text`` as one word a shell reads back exactly: ``shlex.quote`` when printable, else
    bash's (and zsh's) ``$'...'``, with ``\\xhh`` for ASCII controls and ``\\uhhhh`` /
    ``\\Uhhhhhhhh`` for the others (in a UTF-8 locale, as a terminal's shell runs)."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_shell_char(char) for char in text) + "'"


def _shell_char(char: str) -> str:
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def json_line(value: Any) -> str:
    """``value`` as compact JSON that keeps printable non-ASCII as it is and writes every
    non-printable character as a JSON ``\\u`` escape (still valid JSON, the same value)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _json_escape(char) for char in text)


def _json_escape(char: str) -> str:
    return json.dumps(char)[1:-1]  # ensure_ascii: \uhhhh, a surrogate pair above U+FFFF
