"""Receiving a multipart upload as a stream: the file goes straight to disk, hashed as it arrives,
and the request is refused with 413 the moment it passes the size limit. The upload is never held
in memory whole (Starlette's own form parser would spool it all before we could look).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from knowledgeops.errors import InvalidRequest, PayloadTooLarge, ServiceUnavailable
from knowledgeops.service.uploads import StagedFile, Uploads

FILE_FIELD = "file"
MAX_FIELD_BYTES = 64 * 1024  # bytes: a plain form field (datasetId) is small
MULTIPART_OVERHEAD = 1024 * 1024  # bytes allowed on top of the file for boundaries and fields
MAX_PARTS = 8  # the file and a few fields; more is not a client of this API


@dataclass
class ReceivedUpload:
    staged: StagedFile
    file_name: str | None
    declared_type: str | None
    fields: dict[str, str] = field(default_factory=dict)


class _Receiver:
    def __init__(self, uploads: Uploads) -> None:
        self.uploads = uploads
        self.fields: dict[str, str] = {}
        self.staged: StagedFile | None = None
        self.file_name: str | None = None
        self.declared_type: str | None = None
        self._headers: dict[bytes, bytes] = {}
        self._header_field = b""
        self._header_value = b""
        self._field_name: str | None = None
        self._field_value = bytearray()
        self._into_file = False
        self.complete = False
        self.parts = 0

    # python-multipart callbacks -----------------------------------------------------------------
    def on_part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise InvalidRequest(
                f"the multipart body has more than {MAX_PARTS} parts; send one file (field "
                "'file') and at most a datasetId field",
                code="too_many_parts",
            )
        self._headers = {}
        self._field_name = None
        self._field_value = bytearray()
        self._into_file = False

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = b""
        self._header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is None:
            self._field_name = name
            return
        if name != FILE_FIELD:
            raise InvalidRequest(
                f"unexpected file field {name!r}; send the document in a field named 'file'",
                code="unexpected_field",
            )
        if self.staged is not None:
            raise InvalidRequest("send one file per request", code="too_many_files")
        self.file_name = filename.decode("utf-8", "replace")
        declared = self._headers.get(b"content-type")
        self.declared_type = declared.decode("latin-1").strip() if declared else None
        self.staged = self.uploads.stage()
        self._into_file = True

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._into_file:
            assert self.staged is not None
            self.staged.write(data[start:end])
            return
        self._field_value += data[start:end]
        if len(self._field_value) > MAX_FIELD_BYTES:
            raise InvalidRequest(
                f"form field {self._field_name!r} is too long", code="field_too_long"
            )

    def on_end(self) -> None:
        self.complete = True

    def on_part_end(self) -> None:
        if not self._into_file and self._field_name:
            self.fields[self._field_name] = self._field_value.decode("utf-8", "replace")
        self._into_file = False


async def receive_upload(request: Request, uploads: Uploads) -> ReceivedUpload:
    """The upload's file streamed into a staged file of `uploads`, and its form fields."""
    boundary = _boundary(request, uploads.max_upload_bytes)
    receiver = _Receiver(uploads)
    parser = MultipartParser(boundary, {name: getattr(receiver, name) for name in _CALLBACKS})  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
        if not receiver.complete:  # the closing boundary never came: the body was cut short
            raise InvalidRequest(
                "the upload ended before the multipart body was complete; send it again",
                code="bad_multipart",
            )
    except BaseException as exc:
        if receiver.staged is not None:
            receiver.staged.discard()
        refusal = _refusal(exc)
        if refusal is exc:
            raise
        raise refusal from (exc if isinstance(exc, OSError) else None)
    if receiver.staged is None:
        raise InvalidRequest(
            "no file: send the document in a multipart field named 'file'", code="missing_file"
        )
    return ReceivedUpload(
        receiver.staged, receiver.file_name, receiver.declared_type, receiver.fields
    )


_CALLBACKS = (
    "on_part_begin",
    "on_header_field",
    "on_header_value",
    "on_header_end",
    "on_headers_finished",
    "on_part_data",
    "on_part_end",
    "on_end",
)


def _boundary(request: Request, max_bytes: int) -> bytes:
    """The multipart boundary; 400 for another body, 413 when it says it is too large."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidRequest(
            "send the document as multipart/form-data with a field named 'file' "
            "(curl -F file=@PATH …)",
            code="not_multipart",
        )
    declared_length = request.headers.get("content-length", "")
    if declared_length.isdigit() and int(declared_length) > max_bytes + MULTIPART_OVERHEAD:
        limit_mb = max_bytes / 1024 / 1024
        raise PayloadTooLarge(
            f"the upload is larger than this server accepts ({limit_mb:g} MB); split it or ask "
            "the operator to raise KOPS_MAX_UPLOAD_MB"
        )
    return boundary


def _refusal(exc: BaseException) -> BaseException:
    """What the caller is told when reading the upload failed: its own errors as they are, a
    disconnect or a malformed body as 400, our disk failing as 503."""
    if isinstance(exc, ClientDisconnect):
        return InvalidRequest("the client disconnected during the upload")
    if isinstance(exc, InvalidRequest | PayloadTooLarge):
        return exc
    if isinstance(exc, OSError):  # our disk, not the client's body
        return ServiceUnavailable(
            f"the server could not store the upload ({exc.strerror or exc}); try again later",
            code="storage_unavailable",
            retry_after_s=30,
        )
    if isinstance(exc, Exception):
        return InvalidRequest(f"the multipart body is malformed: {exc}", code="bad_multipart")
    return exc
