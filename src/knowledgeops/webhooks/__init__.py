"""Webhooks: each end of a job (completed, failed, cancelled) POSTed, signed, to the URLs that
subscribed to it (docs/architecture.md: Webhooks).

- events.py: the jobs core's outcome listener. In the transaction that ends a job it writes one
  delivery per matching webhook, each with a job of its own (kind `webhook`) and so its outbox
  row: the event exists if and only if the change it reports does.
- deliver.py: that kind's handler. It signs the stored body, sends it (no redirects), records
  the attempt and classifies the answer (2xx done; timeouts, connection errors, 429 and 5xx
  transient; other answers permanent), so the jobs core's retries and backoff apply.
- guard.py: which URLs may be called (no private, loopback or link-local address unless the
  deployment allows it), checked when a webhook is made and again at each delivery, with the
  connection pinned to the address that was checked.
"""

from __future__ import annotations

WEBHOOK_KIND = "webhook"
EVENTS = ("job.completed", "job.failed", "job.cancelled")
