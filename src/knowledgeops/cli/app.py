"""`kops`: the command line. Each command is thin; the work is in the library.

serve, migrate                 the embedded default and the schema (serve.py)
ingest, search, jobs,          talk to a running KnowledgeOps over HTTP (remote.py)
retry, cancel
mcp                            the MCP server on stdio, for a desktop agent (mcp.py)
api, worker, relay             the scale-out processes (scaleout.py)
keys create|list|revoke        API keys, in the database (keys.py)
bench, chaos, postgres         the lab: figures, faults, a local PostgreSQL (bench.py)
eval                           the lab: retrieval quality on judged collections (evaluate.py)
"""

from __future__ import annotations

import typer

from knowledgeops.cli import bench, evaluate, keys, mcp, remote, scaleout, serve

app = typer.Typer(
    help="KnowledgeOps: reliable document ingestion for retrieval-augmented generation.",
    no_args_is_help=True,
    add_completion=False,
)
for commands in (serve, remote, mcp, scaleout, keys, bench, evaluate):
    commands.register(app)


def main() -> None:
    app()
