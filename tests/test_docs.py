"""The documentation is true: its links resolve and its Python examples run.

Files: README.md and docs/*.md.

Links. Every relative link and image (``[text](path)``, ``![alt](path)``, reference
definitions, HTML ``src=``/``href=``) outside code must name an existing file or directory of the
repository, and an anchor (``path.md#heading`` or ``#heading``) must match a heading of that file
under GitHub's slug rules: the heading's text, lower-cased, every character that is not a letter,
digit, ``_``, ``-`` or space dropped, spaces turned into ``-``, and ``-1``, ``-2``... appended to
repeats. Images must stay under 300 KB.

Examples. A ```` ```python ```` block is meant to run unless the line before its fence (blank
lines aside) is an HTML comment that says otherwise:

* ``<!-- not-run: REASON -->``: not run, for a reason that must be given (it needs AWS, a Lambda
  runtime, ...).
* ``<!-- run-as: handler-body -->``: the block is a fragment of a handler. It runs inside a real
  ``@lease_owned`` handler (in-memory provider) with ``lease`` (``current_lease()``), ``event``
  and ``context`` bound, ``table``: a DynamoDB table ``conversations`` keyed on ``threadId``, and
  the handler's data ``text`` and ``message`` (a string) and ``message_id`` (the signal id,
  ``lease.owner``).

Any other ``<!-- name: ... -->`` comment right before a Python block is an error, so a misspelt
marker can neither run nor skip a block silently.

Every block runs in a fresh namespace (the docs' examples are independent of each other; none
relies on an earlier block), with ``context`` bound to a ``LambdaContext`` (examples are handler
code), inside this environment: ``LEASEGUARD_BACKEND=memory``; fake AWS credentials, region
``us-east-1`` and ``moto.mock_aws()`` active, so no block can reach AWS; for a block that
mentions ``redis://localhost:6379/0``, that URL rewritten to the session's real ``redis-server``
(tests/conftest.py), which ``LEASEGUARD_REDIS_URL`` names too; and a temporary working
directory. A block that raises fails its test with the file and the line of the Markdown source.

README.md's examples are run by tests/test_readme.py, which also checks what each one does (it
uses :func:`python_blocks` from here, so the same markers apply); this file runs docs/*.md's.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
from moto import mock_aws

from leaseguard import current_lease, lease_owned
from leaseguard.config import provider_from_env
from leaseguard.protocol.state import DEAD_LIMIT, DEFAULT_MAX_QUEUE, DONE_LIMIT
from leaseguard.providers.memory import InMemoryLeaseProvider
from leaseguard.testing import LambdaContext

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
DOC_FILES = [README, *DOCS]
MAX_IMAGE_BYTES = 300 * 1024
PYTHON = {"python", "py", "python3"}
DIRECTIVES = {"not-run", "run-as"}
RUN_AS = {"handler-body"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*(?P<name>[\w-]+)\s*:\s*(?P<value>.*?)\s*-->\s*$")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


@dataclass(frozen=True)
class Block:
    """A fenced code block: ``line`` is the Markdown line of its first line of code."""

    path: Path
    line: int
    lang: str
    code: str
    directive: str | None = None  # "not-run" or "run-as"
    value: str = ""  # the reason, or the setup's name
    fences: tuple[int, int] = (0, 0)  # 0-based indexes of its opening and closing fence lines

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in PYTHON and self.directive != "not-run"


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        lang = match["info"].split()[0].lower() if match["info"].split() else ""
        start = i + 1
        end = start
        while end < len(lines) and not re.match(
            rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]
        ):
            end += 1
        code = "\n".join(
            line[indent:] if not line[:indent].strip() else line.lstrip()
            for line in lines[start:end]
        )
        directive = value = None
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        found = _DIRECTIVE.match(lines[before]) if before >= 0 else None
        if found:
            directive, value = found["name"], found["value"]
        blocks.append(Block(path, start + 1, lang, code + "\n", directive, value or "", (i, end)))
        i = end + 1
    return blocks


def python_blocks(path: Path) -> list[Block]:
    return [b for b in code_blocks(path) if b.lang in PYTHON]


# --- links ------------------------------------------------------------------------------------


def _blank_code(text: str, path: Path) -> str:
    """``text`` with fenced blocks and inline code spans replaced by spaces (lines kept)."""
    lines = text.splitlines(keepends=True)
    for block in code_blocks(path):
        for n in range(block.fences[0], min(block.fences[1] + 1, len(lines))):
            lines[n] = re.sub(r"[^\n]", " ", lines[n])
    blanked = "".join(lines)
    span = r"(`+)(?:(?!\1)(?!\n[ \t]*\n).)+?\1"  # an inline code span, within one paragraph
    return re.sub(span, lambda m: re.sub(r"[^\n]", " ", m.group(0)), blanked, flags=re.S)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    kept = "".join(c for c in text.lower() if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")  # punctuation (backticks, emphasis, ?, /, :) is dropped


def anchors(path: Path) -> set[str]:
    text = _blank_code_fences_only(path)
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    found |= set(re.findall(r"""<[^>]*\b(?:id|name)=["']([^"']+)["']""", text))
    return found


def _blank_code_fences_only(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    for block in code_blocks(path):
        for n in range(block.fences[0], min(block.fences[1] + 1, len(lines))):
            lines[n] = ""
    return "\n".join(lines)


_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)"
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s.*)?$", re.M)
_HTML = re.compile(r"""<(?:img|a|source)\b[^>]*\b(?:src|href|srcset)=["'](?P<target>[^"']+)["']""")


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every link and image of ``path`` outside code."""
    text = _blank_code(path.read_text(encoding="utf-8"), path)
    for pattern in (_LINK, _REFERENCE, _HTML):
        for match in pattern.finditer(text):
            yield text.count("\n", 0, match.start("target")) + 1, match["target"]


def broken_link(path: Path, target: str) -> str | None:
    """Why ``target`` (a link of ``path``) does not resolve, or None if it does."""
    if not target:
        return "empty link"
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        return None  # http(s), mailto: not checked here (no network)
    file_part, _, anchor = target.partition("#")
    file_part = unquote(file_part.split("?", 1)[0])
    resolved = (path.parent / file_part).resolve() if file_part else path
    try:
        resolved.relative_to(ROOT)
    except ValueError:
        return f"{target!r} points outside the repository"
    if not resolved.exists():
        return f"{rel(resolved)} does not exist"
    if resolved.suffix.lower() in {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}:
        size = resolved.stat().st_size
        if size > MAX_IMAGE_BYTES:
            return f"{rel(resolved)} is {size // 1024} KB, over {MAX_IMAGE_BYTES // 1024} KB"
    if anchor:
        if resolved.suffix.lower() != ".md":
            return f"anchor #{anchor} on a file that is not Markdown"
        if unquote(anchor) not in anchors(resolved):
            return f"no heading of {rel(resolved)} has the anchor #{anchor}"
    return None


@pytest.mark.parametrize("path", DOC_FILES, ids=rel)
def test_links_and_images_resolve(path: Path) -> None:
    problems = [
        f"{rel(path)}:{line}: {why}"
        for line, target in links(path)
        if (why := broken_link(path, target)) is not None
    ]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_link_checker_catches_what_it_should(tmp_path: Path) -> None:
    """The checker itself: GitHub slugs, missing files, missing anchors, links in code ignored."""
    assert slug("The demo: `leaseguard simulate`") == "the-demo-leaseguard-simulate"
    assert slug("Redis or DynamoDB?") == "redis-or-dynamodb"
    assert slug("SAM / CloudFormation") == "sam--cloudformation"
    assert slug("The completed-id memory, attempts") == "the-completed-id-memory-attempts"
    assert slug("`acquire_or_enqueue` in [one step](x.md)") == "acquire_or_enqueue-in-one-step"
    assert "cost" in anchors(ROOT / "docs" / "dynamodb.md")
    assert broken_link(README, "docs/nope.md") == "docs/nope.md does not exist"
    assert broken_link(README, "docs/dynamodb.md#no-such-heading") is not None
    assert broken_link(README, "#install") is None
    assert broken_link(README, "docs/design.md#the-contract") is None
    assert broken_link(README, "#the-contract") is not None  # moved to docs/design.md
    assert broken_link(README, "https://example.com/x") is None
    sample = tmp_path / "sample.md"
    sample.write_text(
        "# Title\n\nSee [a](a.md) and `[b](b.md)`.\n\n```python\n"
        "x = '[c](c.md)'\n```\n\n![d](img/d.png)\n[e]: e.md\n<img src=\"f.png\">\n"
    )
    assert sorted(links(sample)) == [(3, "a.md"), (9, "img/d.png"), (10, "e.md"), (11, "f.png")]
    (block,) = python_blocks(sample)
    assert (block.line, block.code) == (6, "x = '[c](c.md)'\n")


# --- numbers that appear in more than one document ------------------------------------------

# (what, a pattern whose group is the number, the value the code has). The patterns allow a line
# break wherever the text has a space, since the docs wrap their lines.
SHARED_NUMBERS = [
    ("max_queue's default", r"`max_queue`[^.|]{0,40}?default\s(\d[\d,]*)", DEFAULT_MAX_QUEUE),
    ("DEAD_LIMIT", r"`DEAD_LIMIT`\s\((\d[\d,]*)\)", DEAD_LIMIT),
    ("DONE_LIMIT", r"`DONE_LIMIT`(?:\s\(|,\s)(\d[\d,]*)", DONE_LIMIT),
    # tests/test_dynamodb_requests.py::test_an_uncontended_guarded_invocation_is_two_requests
    ("requests per guarded invocation", r"guarded\sinvocation[^.|]{0,30}?\s(\d+)\srequests", 2),
]


def test_numbers_shared_by_documents_agree_with_the_code() -> None:
    problems = []
    for what, pattern, value in SHARED_NUMBERS:
        seen = 0
        for path in DOC_FILES:
            for match in re.finditer(pattern, path.read_text(encoding="utf-8")):
                seen += 1
                if int(match.group(1).replace(",", "")) != value:
                    problems.append(
                        f"{rel(path)}: {what} is {match.group(1)}, the code has {value}"
                    )
        assert seen >= 2, f"{what}: the pattern no longer finds the number in two documents"
    assert not problems, "\n".join(problems)


def test_prices_are_worked_out_in_one_place() -> None:
    """Dollar figures per million requests are computed once, in docs/dynamodb.md's *What an
    invocation costs*; every other document links there instead of repeating them."""
    elsewhere = [
        rel(path)
        for path in DOC_FILES
        if path.name != "dynamodb.md"
        and re.search(r"\$\d[\d.]*\s(?:per|a)\smillion", path.read_text())
    ]
    assert not elsewhere, f"prices outside docs/dynamodb.md: {elsewhere}"
    assert "what-an-invocation-costs" in anchors(ROOT / "docs" / "dynamodb.md")


# --- examples ---------------------------------------------------------------------------------


def _runnable() -> list[Block]:
    return [b for path in DOCS for b in python_blocks(path) if b.runs]


def test_every_directive_is_known_and_explained() -> None:
    problems = []
    for path in DOC_FILES:
        for block in python_blocks(path):
            if block.directive is None:
                continue
            if block.directive not in DIRECTIVES:
                problems.append(f"{block.where}: unknown marker <!-- {block.directive}: -->")
            elif block.directive == "not-run" and len(block.value) < 8:
                problems.append(f"{block.where}: <!-- not-run: --> needs a reason")
            elif block.directive == "run-as" and block.value.split(" ")[0] not in RUN_AS:
                problems.append(f"{block.where}: unknown setup {block.value!r}")
    assert not problems, "\n".join(problems)
    assert _runnable(), "no runnable example found in docs/*.md: is the parser broken?"


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name, value in {
        "LEASEGUARD_BACKEND": "memory",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    provider_from_env.cache_clear()
    with mock_aws():
        yield
    provider_from_env.cache_clear()


def execute(block: Block, namespace: dict[str, Any]) -> str | None:
    """Run ``block`` in ``namespace``; on failure, the report naming the Markdown file and line
    (the code is compiled at its own line of the file, so tracebacks point into the docs)."""
    filename = str(block.path)
    try:
        code = compile("\n" * (block.line - 1) + block.code, filename, "exec")
        exec(code, namespace)
    except Exception as exc:
        lines = [
            f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename
        ]
        if isinstance(exc, SyntaxError) and exc.filename == filename and exc.lineno:
            lines.append(exc.lineno)
        where = f"{rel(block.path)}:{lines[-1] if lines else block.line}"
        return (
            f"{where}: the example starting at {block.where} raised "
            f"{type(exc).__name__}: {exc}\n\n{''.join(traceback.format_exception(exc))}"
        )
    return None


def _handler_body(block: Block, namespace: dict[str, Any]) -> str | None:
    table = boto3.resource("dynamodb").create_table(
        TableName="conversations",
        KeySchema=[{"AttributeName": "threadId", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "threadId", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    failures: list[str | None] = []

    @lease_owned(lambda event: event["threadId"], provider=InMemoryLeaseProvider())
    def handler(event: dict[str, Any], context: Any) -> None:
        lease = current_lease()
        names = {"lease": lease, "event": event, "context": context, "table": table}
        names |= {"text": event["text"], "message": event["text"], "message_id": lease.owner}
        failures.append(execute(block, namespace | names))

    handler({"threadId": "thread-1", "text": "hello"}, LambdaContext(function_arn=""))
    assert len(failures) == 1, f"{block.where}: the guarded handler did not run"
    return failures[0]


@pytest.mark.parametrize("block", _runnable(), ids=lambda b: b.where)
def test_example_runs(block: Block, environment: None, request: pytest.FixtureRequest) -> None:
    if "redis://localhost:6379/0" in block.code:
        url = request.getfixturevalue("redis_url")
        request.getfixturevalue("monkeypatch").setenv("LEASEGUARD_REDIS_URL", url)
        code = block.code.replace("redis://localhost:6379/0", url)
        block = dataclasses.replace(block, code=code)
    namespace: dict[str, Any] = {"__name__": "docs_example", "context": LambdaContext()}
    if block.directive == "run-as":
        failure = _handler_body(block, namespace)
    else:
        failure = execute(block, namespace)
    if failure:
        pytest.fail(failure, pytrace=False)


def test_a_failing_example_is_reported_with_file_and_line(environment: None) -> None:
    path = ROOT / "docs" / "dynamodb.md"
    block = Block(path, 40, "python", "x = 1\n\nraise RuntimeError('boom')\n")
    report = execute(block, {})
    assert report is not None
    assert report.startswith("docs/dynamodb.md:42: the example starting at docs/dynamodb.md:40")
    assert "RuntimeError: boom" in report
