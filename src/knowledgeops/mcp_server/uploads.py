"""What `upload_document` may send: a file by path only from inside the folder a setting names
(KOPS_MCP_UPLOAD_DIR for `kops mcp`, KOPS_MCP_HTTP_UPLOAD_DIR for /mcp), judged on its real
path (symlinks resolved), or text, sent as a Markdown or text file.

The path is judged before anything about the file is looked at, so a refused path says nothing
about what exists outside the folder."""

from __future__ import annotations

from pathlib import Path, PurePath

from mcp.server.mcpserver.exceptions import ToolError

SETTING = "KOPS_MCP_UPLOAD_DIR"  # `kops mcp` (stdio): the agent's own machine
HTTP_SETTING = "KOPS_MCP_HTTP_UPLOAD_DIR"  # /mcp: a folder of the server any key holder may read
TEXT_SUFFIXES = (".md", ".txt")
DEFAULT_NOTE = "note.md"


def confined(path: str, folder: Path | None, setting: str = SETTING) -> Path:
    """The real path of the file `path` names (relative: to `folder`), when it lies inside
    `folder`; a ToolError naming the `setting` that names the folder otherwise."""
    if folder is None:
        raise ToolError(
            f"uploading a file by path is off here: {setting} names no folder to read from "
            "(send the content as text instead)"
        )
    root = folder.resolve()
    candidate = Path(path).expanduser()
    real = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not real.is_relative_to(root):
        raise ToolError(
            f"{path}: outside the folder {setting} names; only files inside it may be uploaded "
            "by path (a relative path is read from it)"
        )
    if not real.is_file():
        raise ToolError(f"{path}: no such file in the folder {setting} names")
    return real


def note_name(file_name: str | None) -> str:
    """The name text is uploaded under: `file_name`, a bare name ending in .md or .txt (its
    suffix tells the API how to parse it)."""
    name = file_name or DEFAULT_NOTE
    if PurePath(name).name != name or PurePath(name).suffix.lower() not in TEXT_SUFFIXES:
        raise ToolError(
            f"file_name {name!r}: text is uploaded as a Markdown or text file, so file_name "
            "must be a bare name ending in .md or .txt"
        )
    return name
