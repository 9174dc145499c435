"""The composition root: each process role built from `Settings`, started and stopped.

- `embedded.EmbeddedRole` (`kops serve`): one process holds it all: SQLite, the in-process queue,
  the relay, the heartbeat and the worker threads, and the API's use cases;
- `api.ApiRole` (`kops api`): the use cases behind HTTP; uploads commit with their outbox row;
- `worker.WorkerRole` (`kops worker`, inside each Celery worker process): the pipeline, the
  runner and the heartbeat;
- `relay.RelayRole` (`kops relay`): the outbox relay, active while it holds the leader lock.

`wiring` chooses every adapter from the settings; `preflight` checks a scale-out process's
database, schema, index, cache and broker before it starts; `first_key` shows the first API key.
"""
