"""`kops eval`: every judged question asked in every mode of a fresh service, and of the baselines.

The service is `kops serve` in a fresh data folder (a child process, as a user runs it); each
collection's documents go in through the upload API into a dataset of their own (collections
that share their documents share the dataset), and every question is asked through the search
API with topK 10. The baselines are built in this process from the same files. Figures: R@1,
R@5 and MRR@10 per collection and mode (all questions, and the dev and test splits), and the
search latency seen by the client (p50, p95).
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from knowledgeops.errors import LabError
from knowledgeops.ingest.embedders.models import ModelSpec
from knowledgeops.lab.bench.endtoend import EmbeddedServer, connect, dataset_jobs, percentile
from knowledgeops.lab.eval import baselines
from knowledgeops.lab.eval.collections import Collection
from knowledgeops.lab.eval.judge import Scores, first_relevant
from knowledgeops.roles.wiring import catalogue, default_model
from knowledgeops.settings import load_settings

TOP_K = 10
MODES = ("vector", "keyword", "hybrid")
BASELINES = ("bm25", "llamaindex")
METRICS = ("r1", "r5", "mrr10")
TERMINAL = ("completed", "failed", "cancelled")
POLL_S = 0.25


class EvalFailed(LabError):
    """The run could not measure (a document failed to ingest, a search failed)."""


@dataclass
class Result:
    collection: str
    mode: str  # a search mode of the service, or a baseline's name
    all: Scores
    dev: Scores
    test: Scores
    latency_ms_p50: float
    latency_ms_p95: float
    misses: list[str] = field(default_factory=list)  # ids of questions not answered in the top 10


@dataclass
class CorpusFigures:
    corpus: str
    documents: int
    chunks: int
    ingest_s: float


@dataclass
class EvalReport:
    model: str
    collections: dict[str, int]  # name → questions
    corpora: list[CorpusFigures] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)

    def get(self, collection: str, mode: str) -> Result | None:
        for result in self.results:
            if result.collection == collection and result.mode == mode:
                return result
        return None


def _scored(collection: Collection, mode: str, ranks: list[int | None], ms: list[float]) -> Result:
    split = {"dev": [], "test": []}  # type: dict[str, list[int | None]]
    for question, rank in zip(collection.questions, ranks, strict=True):
        split[question.split].append(rank)
    return Result(
        collection=collection.name,
        mode=mode,
        all=Scores.of(ranks),
        dev=Scores.of(split["dev"]),
        test=Scores.of(split["test"]),
        latency_ms_p50=round(percentile(ms, 50), 1),
        latency_ms_p95=round(percentile(ms, 95), 1),
        misses=[q.id for q, r in zip(collection.questions, ranks, strict=True) if r is None],
    )


def _ingest(
    client: httpx.Client, corpus: str, documents: Sequence[Path], model: str
) -> tuple[str, CorpusFigures]:
    created = client.post("/datasets", json={"name": f"eval-{corpus}", "embeddingModel": model})
    created.raise_for_status()
    dataset_id: str = created.json()["id"]
    began = time.perf_counter()
    for path in documents:
        with path.open("rb") as handle:
            response = client.post(
                "/docs/upload",
                params={"datasetId": dataset_id},
                files={"file": (path.name, handle)},
            )
        if response.status_code >= 400:
            raise EvalFailed(f"{path.name} was refused: {response.status_code} {response.text}")
    while True:
        jobs = dataset_jobs(client, dataset_id)
        if len(jobs) >= len(documents) and all(j["status"] in TERMINAL for j in jobs):
            break
        time.sleep(POLL_S)
    failed = [f"{j['fileName']}: {j['error']}" for j in jobs if j["status"] != "completed"]
    if failed:
        raise EvalFailed(f"documents of {corpus} did not ingest: " + "; ".join(failed))
    chunks = sum(int(j["totalChunks"] or 0) for j in jobs)
    seconds = round(time.perf_counter() - began, 2)
    return dataset_id, CorpusFigures(corpus, len(documents), chunks, seconds)


def _ask_service(
    client: httpx.Client, dataset_id: str, collection: Collection, mode: str
) -> Result:
    ranks: list[int | None] = []
    ms: list[float] = []
    for question in collection.questions:
        began = time.perf_counter()
        response = client.post(
            f"/datasets/{dataset_id}/search",
            json={"query": question.query, "topK": TOP_K, "mode": mode},
        )
        ms.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            raise EvalFailed(f"search failed: {response.status_code} {response.text}")
        texts = [hit["text"] for hit in response.json()["results"]]
        ranks.append(first_relevant(question.answer, texts))
    return _scored(collection, mode, ranks, ms)


def _ask_baseline(retrieve: baselines.Retrieve, collection: Collection, mode: str) -> Result:
    ranks: list[int | None] = []
    ms: list[float] = []
    for question in collection.questions:
        texts, took = baselines.timed(retrieve, question.query, TOP_K)
        ms.append(took)
        ranks.append(first_relevant(question.answer, texts))
    return _scored(collection, mode, ranks, ms)


def run_eval(
    collections: Sequence[Collection],
    *,
    modes: Sequence[str] = MODES,
    with_baselines: Sequence[str] = BASELINES,
    model: str | None = None,
    workers: int = 2,
    env: dict[str, str] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> EvalReport:
    """`model`: the embedding model of the datasets (a catalogue id; default: the
    deployment's default, as its settings name it)."""
    corpora: dict[str, Sequence[Path]] = {}
    for collection in collections:
        corpora.setdefault(collection.corpus, collection.documents)
    settings = load_settings()
    specs = catalogue(settings)
    chosen = model or default_model(settings)
    if chosen not in specs:
        raise EvalFailed(f"no model {chosen!r} here; the models are " + ", ".join(sorted(specs)))
    spec = specs[chosen]
    report = EvalReport(model=chosen, collections={c.name: len(c.questions) for c in collections})
    server = EmbeddedServer(workers=workers, env={"KOPS_MODEL_VARIANT": "fp32", **(env or {})})
    with server, connect(server.url, server.started, server.log) as (client, _ready):
        datasets = {}
        for corpus, documents in corpora.items():
            say(f"ingesting {corpus}: {len(documents)} documents")
            datasets[corpus], figures = _ingest(client, corpus, documents, chosen)
            report.corpora.append(figures)
        for collection in collections:
            for mode in modes:
                say(f"asking {collection.name} in {mode} mode")
                report.results.append(
                    _ask_service(client, datasets[collection.corpus], collection, mode)
                )
    if with_baselines:
        _baselines(report, collections, corpora, with_baselines, spec, say)
    return report


def _baselines(
    report: EvalReport,
    collections: Sequence[Collection],
    corpora: dict[str, Sequence[Path]],
    names: Sequence[str],
    spec: ModelSpec,
    say: Callable[[str], None],
) -> None:
    embedder = spec.make() if "llamaindex" in names else None
    for corpus, documents in corpora.items():
        for name in names:
            say(f"building the {name} baseline on {corpus}")
            if name == "bm25":
                retrieve = baselines.bm25(documents)
            else:
                assert embedder is not None
                retrieve = baselines.llamaindex(documents, embedder, spec.tokenizer())
            for collection in collections:
                if collection.corpus == corpus:
                    report.results.append(_ask_baseline(retrieve, collection, name))


# --- thresholds ---------------------------------------------------------------------------------
_REQUIREMENT = re.compile(
    r"^(?P<glob>[^:]+):(?P<mode>\w+):(?P<metric>r1|r5|mrr10)(?P<op>>=|<=)"
    r"(?P<ref>[\w.]+)(?:(?P<sign>[+-])(?P<delta>[\d.]+))?$"
)


@dataclass(frozen=True)
class Requirement:
    """`COLLECTIONS:MODE:METRIC>=REF[+DELTA]`, e.g. `*:hybrid:mrr10>=0.85`, `*:hybrid:mrr10>=vector`
    (at least the vector mode's figure), `*:hybrid:mrr10>=llamaindex+0.1`."""

    text: str
    glob: str
    mode: str
    metric: str
    op: str
    ref: str
    delta: float

    @classmethod
    def parse(cls, text: str) -> Requirement:
        match = _REQUIREMENT.match(text.replace(" ", ""))
        if match is None:
            raise ValueError(
                f"{text!r} is not COLLECTIONS:MODE:METRIC>=VALUE (e.g. '*:hybrid:mrr10>=0.85' or "
                "'*:hybrid:mrr10>=vector+0.0'); metrics are r1, r5, mrr10"
            )
        delta = float(match["delta"] or 0) * (-1 if match["sign"] == "-" else 1)
        return cls(
            text, match["glob"], match["mode"], match["metric"], match["op"], match["ref"], delta
        )

    def check(self, report: EvalReport) -> list[str]:
        """What falls short, one line per collection (none when every collection meets it)."""
        short = []
        for name in report.collections:
            if not fnmatch.fnmatchcase(name, self.glob):
                continue
            result = report.get(name, self.mode)
            if result is None:
                continue
            value = getattr(result.all, self.metric)
            try:
                bound = float(self.ref)
            except ValueError:
                other = report.get(name, self.ref)
                if other is None:
                    continue
                bound = getattr(other.all, self.metric)
            bound += self.delta
            fine = value >= bound - 1e-9 if self.op == ">=" else value <= bound + 1e-9
            if not fine:
                short.append(
                    f"{name}: {self.mode} {self.metric} {value:.3f}, "
                    f"wanted {self.op} {bound:.3f} ({self.text})"
                )
        return short


# --- output -------------------------------------------------------------------------------------
def render(report: EvalReport) -> str:
    lines = [f"kops eval · model {report.model} · top {TOP_K}", ""]
    for figures in report.corpora:
        lines.append(
            f"  {figures.corpus}: {figures.documents} documents, {figures.chunks} chunks, "
            f"ingested in {figures.ingest_s:.1f} s"
        )
    header = (
        f"{'collection':<26} {'mode':<11} {'R@1':>6} {'R@5':>6} {'MRR@10':>7}  "
        f"{'test MRR':>8} {'p50 ms':>7} {'p95 ms':>7}"
    )
    lines += ["", header, "-" * len(header)]
    for name, count in report.collections.items():
        rows = [r for r in report.results if r.collection == name]
        for n, r in enumerate(rows):
            label = f"{name} ({count})" if n == 0 else ""
            lines.append(
                f"{label:<26} {r.mode:<11} {r.all.r1:>6.3f} {r.all.r5:>6.3f} {r.all.mrr10:>7.3f}  "
                f"{r.test.mrr10:>8.3f} {r.latency_ms_p50:>7.1f} {r.latency_ms_p95:>7.1f}"
            )
    return "\n".join(lines)


def write_json(report: EvalReport, out: Path) -> None:
    out.write_text(json.dumps(asdict(report), indent=2, ensure_ascii=False) + "\n", "utf-8")
