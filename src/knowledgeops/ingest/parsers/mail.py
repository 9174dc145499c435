"""E-mail: one message (.eml, the standard library's `email` package) or a mailbox of many
(.mbox, its `mailbox` module).

A message's first block is its envelope, `Subject:`, `From:`, `To:`, `Cc:`, `Date:` and the
names of its attachments, one per line; then its text part (or, when it has none, its HTML part
through the HTML cleaner). Each attachment is parsed by the parser of its own type (sniffed
like an upload) into sections of the same document, `Subject › report.pdf › Chapter 2`; an
attached message is read as a message. Attachments that cannot be parsed (an image, a ZIP
archive) are named in the envelope with the reason and not read. Nesting (parts in parts,
messages attached to messages) is bounded by KOPS_MAX_MIME_DEPTH, attachments by
KOPS_MAX_ATTACHMENTS; attachment pages are not the message's pages, so their blocks carry none.
"""

from __future__ import annotations

import mailbox
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from email import policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from pathlib import Path, PurePath

from knowledgeops.errors import JobError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.encoding import codec_name, decode_bytes
from knowledgeops.ingest.parsers.html import parse_html_bytes
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.sections import LINE, SECTION_SEPARATOR
from knowledgeops.ingest.parsers.sniff import SNIFF_BYTES, describe_unsupported, sniff
from knowledgeops.ingest.parsers.text import split_paragraph_groups

ENVELOPE = ("Subject", "From", "To", "Cc", "Date")
NO_SUBJECT = "(no subject)"
MAX_HEADER_CHARS = 2_000
ARCHIVES = ("a ZIP archive", "a gzip archive", "a 7-Zip archive", "a RAR archive")
TEXTLESS = frozenset({"no_text_found", "no_text_layer"})  # an attachment with no text to read
_SAFE_SUFFIX = re.compile(r"^\.[A-Za-z0-9]{1,10}$")


class _Budget:
    """What one document's messages may still hold: attachments and nesting depth."""

    def __init__(self) -> None:
        self.attachments = 0
        self.depth = 0


_BUDGET: ContextVar[_Budget | None] = ContextVar("kops_mail_budget", default=None)


@contextmanager
def _budget() -> Iterator[_Budget]:
    """The budget of the document being parsed: the outermost message's, shared by the messages
    inside it (an attached .eml is parsed by this module again)."""
    budget = _BUDGET.get()
    if budget is not None:
        yield budget
        return
    budget = _Budget()
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


@contextmanager
def _deeper(budget: _Budget, levels: int) -> Iterator[None]:
    most = current_limits().max_mime_depth
    if budget.depth + levels > most:
        raise UserActionRequired(
            f"The e-mail nests parts more than {most} levels deep (messages in messages, "
            "parts in parts); this server reads at most that many (KOPS_MAX_MIME_DEPTH). "
            "Forward its attachments in a new message, or save them and upload them as files.",
            code="mime_too_deep",
        )
    budget.depth += levels
    try:
        yield
    finally:
        budget.depth -= levels


def _structure_depth(message: Message) -> int:
    """How deep the parts of `message` nest (1: a single part; an attached message and the
    message inside it are one level), without recursion."""
    deepest = 0
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        part, depth = stack.pop()
        deepest = max(deepest, depth)
        if part.is_multipart():
            payload = part.get_payload()
            if isinstance(payload, list):
                inner = depth if part.get_content_type() == "message/rfc822" else depth + 1
                stack.extend((child, inner) for child in payload if isinstance(child, Message))
    return deepest


def _header(message: Message, name: str) -> str:
    try:
        values = [str(v) for v in message.get_all(name) or ()]
    except Exception:  # a header policy.default cannot parse: its raw text
        values = [_raw_text(v) for k, v in message.raw_items() if k.lower() == name.lower()]
    text = " ".join(", ".join(values).split())
    return text[:MAX_HEADER_CHARS]


def _raw_text(value: object) -> str:
    """A raw header's text, whose bytes past ASCII the parser kept as lone surrogates
    (surrogateescape), read as UTF-8 (RFC 6532), a byte that is no UTF-8 as U+FFFD."""
    text = str(value)
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte: clean_text replaces it
        return text


def _charset(part: Message) -> str | None:
    label = part.get_content_charset()
    return codec_name(label) if label else None


def _payload(part: Message) -> bytes:
    payload = part.get_payload(decode=True)
    return payload if isinstance(payload, bytes) else b""


def _body(message: EmailMessage) -> Iterator[Block]:
    """The text of the message's body, or of its HTML body when it has no text one."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return
    data = _payload(part)
    if part.get_content_subtype() == "html":
        yield from parse_html_bytes(data, encoding=_charset(part))
        return
    for group in split_paragraph_groups([decode_bytes(data, _charset(part)).replace("\r\n", "\n")]):
        yield Block(text=group)


def _name(part: Message, number: int) -> str:
    try:
        name = part.get_filename()
    except Exception:
        name = None
    name = " ".join(PurePath((name or "").replace("\\", "/")).name.split())[:200]
    return name or f"attachment {number}"


class _Attachment:
    def __init__(self, part: Message, number: int) -> None:
        self.part = part
        self.name = _name(part, number)
        self.data = b"" if part.get_content_type() == "message/rfc822" else _payload(part)
        self.content_type: str | None = None
        self.skipped: str | None = None
        if part.get_content_type() == "message/rfc822":
            return
        self.content_type = sniff(self.data[:SNIFF_BYTES], self.name, part.get_content_type())
        if not self.data.strip():
            self.skipped = "empty"
        elif self.content_type is None:
            what = describe_unsupported(self.data[:SNIFF_BYTES], self.name)
            self.skipped = f"not read: {what}"
            if what in ARCHIVES:
                self.skipped += "; unpack it and upload its files"

    def label(self) -> str:
        return self.name if self.skipped is None else f"{self.name} ({self.skipped})"


def _sectioned(blocks: Iterator[Block], prefix: str) -> Iterator[Block]:
    for block in blocks:
        section = prefix + SECTION_SEPARATOR + block.section if block.section else prefix
        yield Block(text=block.text, section=section)


def message_blocks(message: EmailMessage, prefix: str | None = None) -> Iterator[Block]:
    """The blocks of one message: envelope, body, then each attachment's blocks. `prefix` is the
    section path of the message that holds this one, if any."""
    with _budget() as budget:
        subject = _header(message, "Subject") or NO_SUBJECT
        section = prefix + SECTION_SEPARATOR + subject if prefix else subject
        attachments = []
        for number, part in enumerate(message.iter_attachments(), start=1):
            budget.attachments += 1
            most = current_limits().max_attachments
            if budget.attachments > most:
                raise UserActionRequired(
                    f"The e-mail has more than {most} attachments; this server reads at most "
                    "that many of one document (KOPS_MAX_ATTACHMENTS). Save the attachments "
                    "and upload them as files.",
                    code="too_many_attachments",
                )
            attachments.append(_Attachment(part, number))
        lines = [f"{name}: {value}" for name in ENVELOPE if (value := _header(message, name))]
        if attachments:
            lines.append("Attachments: " + ", ".join(a.label() for a in attachments))
        if lines:
            yield Block(text=LINE.join(lines), section=section)
        for block in _body(message):
            yield Block(text=block.text, section=section)
        for attachment in attachments:
            yield from _attachment_blocks(attachment, section)


def _attachment_blocks(attachment: _Attachment, section: str) -> Iterator[Block]:
    if attachment.part.get_content_type() == "message/rfc822":
        inner = attachment.part.get_payload()
        inner_message = inner[0] if isinstance(inner, list) and inner else None
        if isinstance(inner_message, EmailMessage):
            yield from message_blocks(inner_message, section)
        return
    if attachment.skipped is not None or attachment.content_type is None:
        return
    from knowledgeops.ingest.parsers.registry import parse  # noqa: PLC0415 (the registry holds this parser: imported when an attachment is read)

    suffix = PurePath(attachment.name).suffix
    suffix = suffix if _SAFE_SUFFIX.match(suffix) else ""
    with tempfile.TemporaryDirectory(prefix="kops-mail-") as folder:
        path = Path(folder) / f"attachment{suffix}"
        path.write_bytes(attachment.data)
        attachment.data = b""  # the file holds it now
        prefix = section + SECTION_SEPARATOR + attachment.name
        try:
            yield from _sectioned(parse(path, attachment.content_type), prefix)
        except JobError as exc:  # one attachment that cannot be read costs only itself
            if exc.code not in TEXTLESS:  # a picture without text (a logo) is no failure
                yield Block(text=f"{attachment.name} was not read: {exc.message}", section=prefix)


def _parse_message(data: bytes) -> EmailMessage:
    message = BytesParser(policy=policy.default).parsebytes(data)
    assert isinstance(message, EmailMessage)  # policy.default makes EmailMessage objects
    return message


def _file_blocks(data: bytes) -> Iterator[Block]:
    """A message read from bytes (a file, an mbox entry): its parts' nesting counts against
    the depth of the document, with that of the messages that hold it as files."""
    message = _parse_message(data)
    with _budget() as budget, _deeper(budget, _structure_depth(message)):
        yield from message_blocks(message)


class EmailParser:
    """One e-mail message (.eml, message/rfc822)."""

    content_type = ContentType.EMAIL

    def parse(self, path: Path) -> Iterator[Block]:
        yield from _file_blocks(path.read_bytes())


class MboxParser:
    """A mailbox of messages (.mbox), read message by message."""

    content_type = ContentType.MBOX

    def parse(self, path: Path) -> Iterator[Block]:
        box = mailbox.mbox(str(path), create=False)
        try:
            with _budget():
                for key in box.iterkeys():
                    yield from _file_blocks(box.get_bytes(key))
        finally:
            box.close()
