"""One `Settings` object for the whole service, from `KOPS_*` environment variables (and `.env`).

Validated at start-up: a bad value stops the process with a message that names the setting.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from limits import parse_many
from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from knowledgeops.errors import SettingsError

DEFAULT_TENANT = "default"  # whom a request acts for with KOPS_AUTH=off; the first key's tenant
HARD_LIMIT_GRACE_S = 30.0  # s: after a job's time limit, it gets this long before it is killed
MODEL_MAX_TOKENS = 256  # all-MiniLM-L6-v2 reads at most 256 tokens, [CLS] and [SEP] included


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KOPS_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    # where things live
    data_dir: Path = Field(Path("./kops-data"), description="Folder for the database and files.")
    database_url: SecretStr | None = Field(
        None, description="SQLAlchemy URL; default: a SQLite file in data_dir."
    )
    keyword_index_min_chunks: int = Field(
        20_000,
        ge=0,
        description="Active chunks in the whole table from which keyword searches go through "
        "the keyword index (Tantivy, kept beside the database) instead of the database's own "
        "full-text search (FTS5, GIN); 0: from the first chunk.",
    )
    keyword_index_dir: Path | None = Field(
        None,
        description="Scale-out: where each process serving searches keeps its keyword index "
        "(Tantivy, a slot per process; best on a local disk); default: "
        "data_dir/keyword-index/<host name>.",
    )

    # scale-out (docs/architecture.md: Two topologies): a broker feeds Celery workers; Redis caches
    # embeddings
    broker_url: SecretStr | None = Field(
        None, description="Celery broker for `kops worker`/`kops relay`: redis://… or amqp://…"
    )
    cache_url: SecretStr | None = Field(
        None,
        description="Redis for the embedding cache (its own database number); default: a table "
        "in the database.",
    )
    embed_cache: bool = Field(True, description="Reuse vectors of text embedded before.")
    job_time_limit_s: float = Field(
        3600.0, gt=0, description="A job running longer is stopped and failed."
    )
    broker_visibility_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Redis redelivers an unacknowledged job after this; default 2 × "
        "job_time_limit_s, at least the hard limit + 60 s (it must outlast the longest job).",
    )

    # HTTP
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    max_upload_mb: float = Field(100.0, gt=0, description="Largest accepted upload, in MiB.")
    auth: Literal["on", "off"] = Field(
        "on",
        description="on: every endpoint but /healthz, /readyz and /metrics needs an API key "
        "(`kops keys create`); off: open, one tenant (a warning is logged at start).",
    )
    metrics_token: SecretStr | None = Field(
        None, description="If set, /metrics needs `Authorization: Bearer <this token>`."
    )
    rate_limit: str = Field(
        "1200/minute",
        description="Requests per API key (limits notation: N/second|minute|hour); over it: 429.",
    )
    max_waiting_jobs: int = Field(
        10_000,
        ge=1,
        description="Uploads get 429 with Retry-After while this many jobs wait for a worker.",
    )

    max_streams_per_key: int = Field(
        50,
        ge=1,
        le=10_000,
        description="Event streams (GET …/events) one API key may hold open in one API process; "
        "one more gets 429.",
    )
    change_retention_s: float = Field(
        86_400.0,
        gt=0,
        description="How long the record of job changes that event streams replay "
        "(Last-Event-ID) is kept, in seconds; the relay prunes older changes.",
    )
    stream_poll_s: float = Field(
        0.2,
        gt=0,
        le=10,
        description="How often an API process reads new job changes for its open event streams.",
    )
    stream_heartbeat_s: float = Field(
        15.0,
        gt=0,
        le=300,
        description="An idle event stream gets a comment line this often, so proxies keep it "
        "open and clients notice a dead connection.",
    )
    mcp_upload_dir: Path | None = Field(
        None,
        description="The folder the MCP tool upload_document of `kops mcp` (stdio, the agent's "
        "own machine) may read files from by path: only files whose real path, symlinks "
        "resolved, lies inside it; unset: it uploads text only.",
    )
    mcp_http_upload_dir: Path | None = Field(
        None,
        description="The same for /mcp, where any API key's holder calls the tool: a folder of "
        "this server they may all read (a shared drive). Unset: text uploads only.",
    )

    # workers
    workers: int = Field(2, ge=1, le=64, description="Worker threads in the embedded default.")
    heartbeat_interval_s: float = Field(5.0, gt=0)  # s
    stale_after_s: float = Field(60.0, gt=0)  # s: a running job silent this long is rescued
    max_attempts: int = Field(3, ge=1, le=20)
    backoff_base_s: float = Field(2.0, gt=0)  # s: first retry waits up to this
    backoff_max_s: float = Field(300.0, gt=0)  # s: no retry waits longer
    relay_interval_s: float = Field(1.0, gt=0)  # s: how often the relay scans
    republish_after_s: float = Field(
        60.0, gt=0
    )  # s: re-publish a runnable job nobody claimed, once the broker queue is empty
    shutdown_grace_s: float = Field(
        15.0, ge=0
    )  # s: running jobs get this long to reach a batch end

    # webhooks
    webhook_allow_private: bool = Field(
        False,
        description="Allow webhook URLs on private, loopback or link-local addresses (a "
        "receiver inside your network). Off: refused when the webhook is made and when each "
        "delivery resolves the host (SSRF).",
    )
    webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=60,
        description="One delivery attempt's limit, all of it: connect, send, the answer.",
    )
    webhook_max_attempts: int = Field(
        20,
        ge=1,
        le=100,
        description="Attempts per event before its delivery fails (with the jobs' backoff "
        "between them: about half an hour in all with the defaults, an hour at most).",
    )
    webhook_workers: int = Field(
        2,
        ge=1,
        le=32,
        description="Delivery threads in the embedded default: a lane of their own, so a slow "
        "receiver never holds a worker an upload needs.",
    )

    # ingestion
    embedder: Literal["local", "openai"] = Field(
        "local", description="local: all-MiniLM-L6-v2 on the CPU; openai: an OpenAI-compatible API"
    )
    openai_base_url: str = Field("https://api.openai.com/v1", description="…/v1 of the provider")
    openai_model: str = "text-embedding-3-small"
    openai_dimensions: int = Field(1536, ge=1, le=16_000, description="Length of its vectors.")
    openai_api_key: SecretStr | None = None
    openai_api_key_file: Path | None = Field(
        None, description="A file holding the key; re-read when it changes and after a 401."
    )
    openai_concurrency: int = Field(
        4, ge=1, le=256, description="Requests at once, shared by all workers (Redis if set)."
    )
    openai_timeout_s: float = Field(30.0, gt=0)
    model_threads: int = Field(
        0,
        ge=0,
        description="Torch threads for the model; 0 = the cores this process may use "
        "(CPU affinity and the cgroup's CPU quota).",
    )
    model_variant: Literal["fp32", "int8"] = Field(
        "fp32",
        description="The local model as shipped (fp32, torch) or quantised to int8 and run by "
        "ONNX Runtime (about 1.3-1.5x faster here; built once into KOPS_DATA_DIR/models and used "
        "only if its vectors reach a mean cosine of 0.99 to fp32 on real text; needs the int8 "
        "extra).",
    )
    worker_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="In the embedded default, how much lower the CPU priority of the model and "
        "the worker threads is than the API's (Linux nice, per thread), so uploads are answered "
        "at once while the model saturates the cores; 0 = the same. Scale-out workers, processes "
        "of their own, keep their priority (nice the process to share a machine).",
    )
    embedding_model: str = Field(
        "",
        description="The model of datasets created without `embeddingModel` (a model id, see "
        "GET /models); empty = all-MiniLM-L6-v2 as KOPS_MODEL_VARIANT says, or KOPS_OPENAI_MODEL "
        "with KOPS_EMBEDDER=openai. A dataset keeps the model it was created with.",
    )
    embed_batch_size: int = Field(32, ge=1, le=1024)
    pdf_part_pages: int = Field(
        25,
        ge=0,
        description="A PDF of more pages is split into parts of this many pages, which workers "
        "ingest in parallel: one job, one generation of one document. 0 = never split.",
    )
    chunk_size: int = Field(200, ge=16, description="Tokens per chunk (model tokenizer).")
    chunk_overlap: int = Field(30, ge=0, description="Tokens shared by neighbouring chunks.")

    # what one document may cost to parse (a document over a limit fails with a message
    # naming the limit; ingest/parsers/limits.py, built in roles/wiring.py)
    max_pdf_pages: int = Field(5_000, ge=1, description="Pages of one PDF.")
    max_unzipped_mb: float = Field(
        1_024.0, gt=0, description="A DOCX, PPTX, XLSX or EPUB package, unpacked, in MiB."
    )
    max_zip_ratio: float = Field(200.0, ge=10, description="Inflation ratio of one package part.")
    max_html_mb: float = Field(64.0, gt=0, description="One HTML page or e-book chapter, in MiB.")
    max_sheet_rows: int = Field(1_048_576, ge=1, description="Rows of one sheet or CSV file.")
    max_sheet_cells: int = Field(20_000_000, ge=1, description="Cells of one workbook or CSV.")
    max_mime_depth: int = Field(10, ge=1, description="E-mail parts nested in parts, at most.")
    max_attachments: int = Field(200, ge=0, description="Attachments of one e-mail or mbox.")
    max_text_chars: int = Field(50_000_000, ge=1, description="Text of one document.")
    max_chunks_per_document: int = Field(100_000, ge=1)
    parse_timeout_s: float = Field(600.0, gt=0, description="Parsing of one document, at most.")
    max_image_pixels: int = Field(
        100_000_000, ge=1_000_000, description="One image, or one TIFF page, in pixels."
    )
    ocr_min_confidence: float = Field(
        0.8,
        ge=0,
        le=1,
        description="An OCR'd page read with a lower confidence is flagged in its job "
        "(lowConfidencePages) and left out of the index.",
    )
    ocr_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="Model threads of each parser process's OCR; 0 = the cores shared out "
        "among the worker threads.",
    )
    parse_memory_mb: int = Field(4_096, ge=256, description="Parser process address space.")
    parse_isolation: Literal["process", "inline"] = Field(
        "process",
        description="process: parsers run in a child process that a hostile file can crash or "
        "hang without harm; inline: in the worker thread (debugging only).",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _check_chunking(self) -> Self:
        if self.chunk_size > MODEL_MAX_TOKENS - 2:
            raise ValueError(
                f"chunk_size {self.chunk_size} is more than the model reads "
                f"({MODEL_MAX_TOKENS - 2} tokens plus 2 special tokens)"
            )
        if self.chunk_overlap >= self.chunk_size // 2:
            raise ValueError(
                f"chunk_overlap {self.chunk_overlap} must be less than half of "
                f"chunk_size {self.chunk_size}"
            )
        if self.stale_after_s < 3 * self.heartbeat_interval_s:
            raise ValueError(
                f"stale_after_s {self.stale_after_s:g} must be at least three heartbeats "
                f"(3 × heartbeat_interval_s = {3 * self.heartbeat_interval_s:g}); otherwise live "
                "jobs are taken for lost"
            )
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must not be less than backoff_base_s")
        hard_limit = self.job_time_limit_s + HARD_LIMIT_GRACE_S
        if self.visibility_timeout_s <= hard_limit:
            raise ValueError(
                f"broker_visibility_timeout_s {self.visibility_timeout_s:g} must be longer than "
                f"job_time_limit_s + {HARD_LIMIT_GRACE_S:g} s (the hard limit, {hard_limit:g}); "
                "otherwise Redis hands a running job to a second worker"
            )
        _check_redis_roles(self.broker_url, self.cache_url)
        _check_rate(self.rate_limit)
        if self.metrics_token is not None and len(self.metrics_token.get_secret_value()) < 16:
            raise ValueError("metrics_token must be at least 16 characters (or unset: open)")
        if (
            self.embedder == "openai"
            and self.openai_api_key is None
            and self.openai_api_key_file is None
        ):
            raise ValueError(
                "KOPS_EMBEDDER=openai needs KOPS_OPENAI_API_KEY or KOPS_OPENAI_API_KEY_FILE"
            )
        if self.embedder == "openai" and self.broker_url is not None and self.cache_url is None:
            raise ValueError(
                "KOPS_EMBEDDER=openai with workers on a broker needs KOPS_CACHE_URL: the "
                "concurrency limit all workers share lives in that Redis"
            )
        return self

    @property
    def visibility_timeout_s(self) -> float:
        if self.broker_visibility_timeout_s is not None:
            return self.broker_visibility_timeout_s
        return max(2 * self.job_time_limit_s, self.job_time_limit_s + HARD_LIMIT_GRACE_S + 60)

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{(self.data_dir / 'kops.db').resolve()}"

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def is_sqlite(self) -> bool:
        return self.resolved_database_url.startswith("sqlite")

    def describe(self) -> dict[str, object]:
        """The settings as safe to log: secrets say only whether they are set."""
        shown: dict[str, object] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            shown[name] = (
                ("set" if value is not None else "not set")
                if isinstance(value, SecretStr) or name.endswith("_url")
                else value
            )
        return shown


def _check_rate(rate: str) -> None:

    try:
        items = parse_many(rate)
    except ValueError:
        items = []
    if len(items) != 1 or items[0].amount < 1:
        raise ValueError(
            f"rate_limit {rate!r} is not one rate such as 600/minute, 20/second or 10000/hour"
        )


def _check_redis_roles(broker: SecretStr | None, cache: SecretStr | None) -> None:
    """Broker and cache must not share a Redis database: flushing the cache would drop jobs'
    messages (docs/architecture.md: Two topologies)."""

    if cache is None:
        return
    c = urlsplit(cache.get_secret_value())
    if not c.scheme.startswith("redis"):
        raise ValueError("cache_url must be a redis:// or rediss:// URL")
    if broker is None:
        return
    b = urlsplit(broker.get_secret_value())
    if not b.scheme.startswith("redis"):
        return
    same_server = (b.hostname, b.port or 6379) == (c.hostname, c.port or 6379)
    if same_server and (b.path.strip("/") or "0") == (c.path.strip("/") or "0"):
        raise ValueError(
            "cache_url and broker_url point at the same Redis database; give the cache its own "
            "database number (for example redis://host:6379/2)"
        )


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, turning validation errors into one clear message."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(part) for part in err["loc"]) or "settings"
            env = f"KOPS_{loc.upper()}" if err["loc"] else "settings"
            shown = os.environ.get(env, "") if "url" not in loc and "key" not in loc else "…"
            got = f" (got {shown!r})" if shown else ""
            lines.append(f"{env}: {err['msg']}{got}")
        raise SettingsError("invalid settings:\n  " + "\n  ".join(lines)) from None
