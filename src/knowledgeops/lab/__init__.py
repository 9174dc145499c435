"""The lab: what tests and measures KnowledgeOps, not the product.

- `topology`: the scale-out topology (`kops api`, relays, Celery workers) as real processes;
- `devpg`: a PostgreSQL with pgvector from the `pgserver` package, on a free port;
- `fakeprovider`: an OpenAI-compatible embeddings server with faults on command;
- `chaos`: `kops chaos`, faults injected into a running topology, and the audit after;
- `bench`: `kops bench`, the figures of docs/performance.md.

Nothing in the product imports it (an import-linter contract in `make lint` says so); `kops
bench`, `kops chaos` and `kops postgres` import it when they run, and say which extra to install
when a package it needs is missing.
"""
