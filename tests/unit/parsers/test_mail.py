from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path

import pytest

from knowledgeops.errors import UserActionRequired
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.mail import EmailParser, MboxParser
from tests.fixtures.documents import make_gif, make_png
from tests.fixtures.office import make_eml, make_mbox, sample_message, simple_message


def parse_eml(path: Path) -> list[Block]:
    return list(EmailParser().parse(path))


def test_envelope_body_and_each_attachment_by_its_own_parser(tmp_path: Path) -> None:
    blocks = parse_eml(make_eml(tmp_path / "m.eml"))
    subject = "Harbour inspection report"
    assert blocks[0] == Block(
        text=(
            f"Subject: {subject}\n"
            "From: Ada Quill <ada@example.org>\n"
            "To: crew@example.org\n"
            "Date: Mon, 06 May 2024 09:30:00 +0000\n"
            "Attachments: survey.pdf, minutes.docx, tools.csv, "
            "photos.zip (not read: a ZIP archive; unpack it and upload its files)"
        ),
        section=subject,
    )
    # the text part, not its HTML alternative
    assert blocks[1] == Block(
        text="The pier pilings need tarring before winter.\n\nRegards, Ada", section=subject
    )
    sections = [b.section for b in blocks]
    assert f"{subject} › survey.pdf" in sections
    assert f"{subject} › minutes.docx › Annual Report › Results" in sections
    assert f"{subject} › tools.csv" in sections
    text = "\n".join(b.text for b in blocks)
    assert "Survey page one: barnacles on the hull." in text
    assert "| Quarter | Revenue |" in text
    assert "Tool: Caulking iron; Count: 4" in text
    assert "never indexed" not in text  # the ZIP is named, never opened
    assert all(b.page is None for b in blocks)  # an attachment's pages are not the message's


def test_an_html_only_message_goes_through_the_html_cleaner_in_its_charset(tmp_path: Path) -> None:
    message = simple_message(
        "Menu", "<html><body><nav>Home</nav><p>Crème brûlée tonight</p></body></html>", html=True
    )
    message.replace_header("Content-Type", 'text/html; charset="iso-8859-1"')
    message.set_payload("<html><body><p>Crème brûlée tonight</p></body></html>".encode("latin-1"))
    blocks = parse_eml(make_eml(tmp_path / "h.eml", message))
    assert blocks[-1] == Block(text="Crème brûlée tonight", section="Menu")


def test_attached_messages_are_read_as_messages_and_unreadable_attachments_named(
    tmp_path: Path,
) -> None:
    outer = simple_message("Fwd: pilings", "See below.")
    outer.add_attachment(simple_message("Pilings", "Oak pilings rot slowly."))
    outer.add_attachment(
        make_gif(tmp_path / "p.gif").read_bytes(),
        maintype="image",
        subtype="gif",
        filename="photo.gif",
    )
    outer.add_attachment(  # a picture without text (a logo): read by OCR, nothing to say
        make_png(tmp_path / "logo.png").read_bytes(),
        maintype="image",
        subtype="png",
        filename="logo.png",
    )
    outer.add_attachment(
        b"%PDF-1.4 broken", maintype="application", subtype="pdf", filename="broken.pdf"
    )
    blocks = parse_eml(make_eml(tmp_path / "f.eml", outer))
    assert "photo.gif (not read: a GIF image)" in blocks[0].text
    assert "logo.png" in blocks[0].text
    assert not any("logo.png" in (b.section or "") for b in blocks)
    assert Block(text="Oak pilings rot slowly.", section="Fwd: pilings › Pilings") in blocks
    (broken,) = [b for b in blocks if b.section == "Fwd: pilings › broken.pdf"]
    assert broken.text.startswith("broken.pdf was not read: ")


def test_nesting_and_attachment_limits_name_their_settings(tmp_path: Path) -> None:
    message: EmailMessage = simple_message("Level 0", "innermost")
    for level in range(1, 6):
        outer = simple_message(f"Level {level}", "wrapper")
        outer.add_attachment(message)
        message = outer
    path = make_eml(tmp_path / "deep.eml", message)
    assert len(parse_eml(path)) > 5
    with (
        parse_limits.using(ParseLimits(max_mime_depth=4)),
        pytest.raises(UserActionRequired) as caught,
    ):
        parse_eml(path)
    assert caught.value.code == "mime_too_deep"
    assert "KOPS_MAX_MIME_DEPTH" in caught.value.message
    many = simple_message("Many", "body")
    for n in range(5):
        many.add_attachment(
            f"note {n}".encode(), maintype="text", subtype="plain", filename=f"{n}.txt"
        )
    with (
        parse_limits.using(ParseLimits(max_attachments=3)),
        pytest.raises(UserActionRequired) as caught,
    ):
        parse_eml(make_eml(tmp_path / "many.eml", many))
    assert caught.value.code == "too_many_attachments"
    assert "KOPS_MAX_ATTACHMENTS" in caught.value.message


def test_broken_headers_and_a_message_without_anything_do_not_crash(tmp_path: Path) -> None:
    path = tmp_path / "odd.eml"
    path.write_bytes(
        b"From: =?utf-8?q?broken\r\nSubject: =?unknown-charset?b?SGVsbG8=?=\r\n"
        b"To: <<<@>>>\r\nContent-Type: text/plain; charset=no-such-charset\r\n\r\nBody text\r\n"
    )
    blocks = parse_eml(path)
    assert blocks[-1].text == "Body text"
    assert blocks[0].text.startswith("Subject: ")


def test_a_header_read_raw_keeps_its_utf8_and_no_undecodable_byte(tmp_path: Path) -> None:
    """A truncated "To: ada@" makes the parser's header policy fail (IndexError), so the To
    headers are read raw, where bytes past ASCII are lone surrogates: they are read as UTF-8
    again, and a byte that is no UTF-8 becomes U+FFFD, never a surrogate the tokenizer refuses."""
    path = tmp_path / "raw.eml"
    path.write_bytes(b"Subject: One\nTo: Zo\xc3\xab\x80 <z@example.org>\nTo: ada@")
    blocks = parse_eml(path)
    assert blocks[0].text == "Subject: One\nTo: Zo\u00eb\ufffd <z@example.org>, ada@"


def test_an_mbox_is_read_message_by_message(tmp_path: Path) -> None:
    box = make_mbox(
        tmp_path / "box.mbox",
        [
            simple_message("First note", "Buoy seven is adrift."),
            simple_message("Second note", "<p>Gull <b>colony</b> on the mole</p>", html=True),
            sample_message(tmp_path),
        ],
    )
    blocks = list(MboxParser().parse(box))
    assert Block(text="Buoy seven is adrift.", section="First note") in blocks
    assert Block(text="Gull colony on the mole", section="Second note") in blocks
    assert any(b.section == "Harbour inspection report › survey.pdf" for b in blocks)
    assert [b.section for b in blocks if b.text.startswith("Subject: ")] == [
        "First note",
        "Second note",
        "Harbour inspection report",
    ]
