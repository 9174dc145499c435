"""`kops eval` end to end on a tiny collection: real Debian FAQ pages in Chinese through a fresh
`kops serve` and the real model, every mode asked, the BM25 baseline beside it, the figures
printed and written, and a threshold that falls short failing the run."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from knowledgeops.ingest.index.pgvector import FILTER_WIDEN_POWER
from tests.e2e.conftest import run_kops

pytestmark = [pytest.mark.e2e, pytest.mark.model]

EVAL = Path(__file__).resolve().parents[2] / "eval"


def test_eval_measures_every_mode_and_fails_below_a_threshold(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    result = run_kops(
        "eval",
        "--collections",
        str(EVAL),
        "--only",
        "debian-faq-zh-cn",
        "--max-pages",
        "2",
        "--baselines",
        "bm25",
        "--require",
        "*:keyword:r5>=0.5",
        "--require",
        "*:hybrid:mrr10>=keyword+1.0",  # cannot be met: MRR is at most 1
        "--out",
        str(out),
        timeout=300,
    )
    assert result.returncode == 1, result.output
    assert "below the threshold" in result.output
    assert "debian-faq-zh-cn: hybrid mrr10" in result.output
    assert "keyword r5" not in result.output  # the other threshold was met
    report = json.loads(out.read_text("utf-8"))
    questions = report["collections"]["debian-faq-zh-cn"]
    assert questions >= 10  # the sections of the first two pages whose heading is a question
    modes = {r["mode"]: r for r in report["results"]}
    assert set(modes) == {"vector", "keyword", "hybrid", "bm25"}
    for figures in modes.values():
        scores = figures["all"]
        assert 0 <= scores["r1"] <= scores["r5"] <= 1
        assert scores["r1"] <= scores["mrr10"] <= 1
        assert scores["questions"] == questions
        assert figures["dev"]["questions"] + figures["test"]["questions"] == questions
    assert modes["keyword"]["all"]["r5"] >= 0.5  # Chinese words found by their words
    assert modes["vector"]["latency_ms_p95"] > 0
    (corpus,) = report["corpora"]
    assert corpus["documents"] == 2
    assert corpus["chunks"] > 10
    assert "debian-faq-zh-cn (" in result.output  # the printed table


@pytest.mark.timeout(900)  # both topologies, their sweeps, and ingestion through the real model
def test_bench_search_measures_both_topologies_at_a_given_number_of_chunks(
    tmp_path: Path,
) -> None:
    out = tmp_path / "search.json"
    result = run_kops(
        "bench", "search", "--chunks", "6000", "--questions", "20", "--collections", str(EVAL),
        "--hnsw-sweep", "8:16,16:32", "--ingest-rounds", "2", "--out", str(out), timeout=850,
    )  # fmt: skip
    assert result.returncode == 0, result.output
    figures = {f["topology"]: f for f in json.loads(out.read_text())}
    assert set(figures) == {"embedded", "scale-out"}
    for f in figures.values():
        assert (f["chunks"], f["questions"]) == (6000, 20)
        assert f["write_s"] > 0
        assert f["disk_mb"] > 0
        assert set(f["latency_ms"]) == {
            f"{dataset}{filtered} {mode}"
            for dataset in ("large", "small")
            for filtered in ("", " filtered")
            for mode in ("vector", "keyword", "hybrid")
        }
        for latency in f["latency_ms"].values():
            assert 0 < latency["p50"] <= latency["p95"]
        assert set(f["recall_at_10"]) == {"large", "large filtered", "small", "small filtered"}
        assert min(f["recall_at_10"].values()) >= 0.9
        # how many reported hybrid searches looked their words up first: where the scan takes
        # every core while other processes keep cores busy (service.search.words_first)
        in_turn = f["settings"]["hybrid_lists_in_turn"]
        assert set(in_turn) == set(f["recall_at_10"])
        assert all(share.endswith("/20") for share in in_turn.values())
    # PostgreSQL searches each list on a backend of its own: never in turn
    assert set(figures["scale-out"]["settings"]["hybrid_lists_in_turn"].values()) == {"0/20"}
    embedded = figures["embedded"]
    assert embedded["index_memory_mb"] > 0  # the large dataset went through its graph
    assert embedded["settings"]["filter_bitmaps_built"] >= 1  # its filter's scan, a bitmap's
    assert sum(embedded["settings"]["filter_bitmap_ways"].values()) >= 1  # … used one way
    assert embedded["settings"]["probe_sweep"]
    # what keeping the index costs ingestion: the real model's throughput with the index's
    # threads taking the chunks in and with them stopped, in turn, searches timed meanwhile;
    # the documents are gone after (the kept database's test below counts its rows)
    ingestion = embedded["settings"]["ingestion"]
    assert set(ingestion["chunks_per_s"]) == {"kept", "kept, stage full", "not kept"}
    assert all(len(rates) == 2 for rates in ingestion["chunks_per_s"].values())
    assert ingestion["rounds"] == 2
    assert ingestion["upkeep_in_not_kept_runs"] == 0  # the runs without it were without it
    assert all(rate > 0 for rates in ingestion["chunks_per_s"].values() for rate in rates)
    assert -100 < ingestion["throughput_lost_pct"] < 100
    assert -100 < ingestion["throughput_lost_stage_full_pct"] < 100
    # a kept run's chunks, staged while no core was spare
    assert ingestion["staged_at_end_max"] >= 0
    assert ingestion["search_ms_while_ingesting"]["searches"] > 0
    assert ingestion["worker_nice"] == 10
    assert ingestion["snapshot_s"] > 0
    # what a search's counts cost when they cannot be kept, per dataset and filter
    assert set(embedded["settings"]["count_ms"]) == set(embedded["recall_at_10"])
    assert all(ms > 0 for ms in embedded["settings"]["count_ms"].values())
    # pgvector's graphs built again with each M and ef_construction asked for, ef_search swept
    sweep = figures["scale-out"]["settings"]["hnsw_sweep"]
    assert set(sweep) == {"8/16", "16/32"}
    for build in sweep.values():
        assert build["build_s"] > 0
        assert build["size_mb"] > 0
        assert set(build["ef_search"]) == {"100", "200", "400", "800"}
        assert all(0 < ef["recall"] <= 1 for ef in build["ef_search"].values())
    # how far a filtered walk widens, each power with the filter that admits half the dataset
    # (the output's shape: at 6,000 chunks that half is under EXACT_MAX_ROWS, searched exactly;
    # test_pgvector_plan checks the widths)
    widen = figures["scale-out"]["settings"]["filter_widen_sweep"]
    assert set(widen) == {"0/200", "0.5/282", "0.75/336", "1/400"}
    assert all(0 < power["recall"] <= 1 and power["p95"] > 0 for power in widen.values())
    assert figures["scale-out"]["settings"]["filter_widen_power"] == FILTER_WIDEN_POWER
    # how far a hybrid search's vector list walks: hybrid latency and the fused top 10 against
    # the fusion with the exact vector list
    fused = figures["scale-out"]["settings"]["fused_sweep"]
    assert set(fused) == {"100", "140", "200"}
    assert all(0 < ef["hybrid_recall"] <= 1 and ef["p95"] > 0 for ef in fused.values())
    assert "kops bench search" in result.output  # the table


def test_bench_search_measures_a_kept_database_again_as_a_start_of_this_version_finds_it(
    tmp_path: Path,
) -> None:
    """A kept embedded database is measured again without being written: a start of this
    version fills what an earlier one lacked (here the plain vector table), and without
    --rebuild the graphs are loaded as they were kept instead of built again."""
    kept = tmp_path / "kept"
    args = (
        "bench", "search", "--chunks", "3000", "--questions", "20", "--topology", "embedded",
        "--collections", str(EVAL), "--keep", str(kept),
        "--ingest-rounds", "1",  # the subject is the kept database, not the upkeep's cost
    )  # fmt: skip
    first = run_kops(*args, "--out", str(tmp_path / "first.json"), timeout=600)
    assert first.returncode == 0, first.output
    (written,) = json.loads((tmp_path / "first.json").read_text())
    assert written["settings"]["reused_database"] is False
    with sqlite3.connect(kept / "kops.db") as conn:  # the index as an earlier version left it
        conn.execute("DROP TABLE chunk_vectors_384_v2_rows")
    again = run_kops(*args, "--no-rebuild", "--out", str(tmp_path / "again.json"), timeout=600)
    assert again.returncode == 0, again.output
    (measured,) = json.loads((tmp_path / "again.json").read_text())
    assert measured["settings"]["reused_database"] is True
    assert measured["settings"]["rebuilt_side_indexes"] is False
    assert measured["write_s"] < written["write_s"]  # nothing written
    assert min(measured["recall_at_10"].values()) >= 0.9
    with sqlite3.connect(kept / "kops.db") as conn:
        (rows,) = conn.execute("SELECT count(*) FROM chunk_vectors_384_v2_rows").fetchone()
    assert rows == 3000


def test_bench_search_measures_a_kept_postgresql_server_again_without_writing_it(
    tmp_path: Path,
) -> None:
    """The scale-out bench keeps its PostgreSQL server's data too: measured again, its chunks
    are not written, and without --rebuild pgvector's graphs are used as they were kept."""
    # PostgreSQL runs as `postgres` when we are root: its folder's parents must let it in,
    # and pytest's own temporary folders do not
    scratch = Path(tempfile.mkdtemp(prefix="kops-kept-pg-"))
    scratch.chmod(0o755)
    kept = scratch / "kept"
    args = (
        "bench", "search", "--chunks", "3000", "--questions", "20", "--topology", "scale-out",
        "--collections", str(EVAL), "--keep", str(kept),
    )  # fmt: skip
    try:
        first = run_kops(*args, "--out", str(tmp_path / "first.json"), timeout=600)
        assert first.returncode == 0, first.output
        (written,) = json.loads((tmp_path / "first.json").read_text())
        assert written["settings"]["reused_database"] is False
        assert written["index_build_s"] > 0
        assert (kept / "pg" / "pgdata" / "PG_VERSION").exists()
        again = run_kops(*args, "--no-rebuild", "--out", str(tmp_path / "again.json"), timeout=600)
        assert again.returncode == 0, again.output
        (measured,) = json.loads((tmp_path / "again.json").read_text())
        assert measured["settings"]["reused_database"] is True
        assert measured["settings"]["rebuilt_side_indexes"] is False
        assert measured["index_build_s"] == 0  # the graphs as kept
        assert measured["write_s"] < written["write_s"]  # nothing written
        assert measured["disk_mb"] == pytest.approx(written["disk_mb"], rel=0.2)  # no copy
        assert min(measured["recall_at_10"].values()) >= 0.9
        # one folder holds one topology's database
        both = run_kops(
            "bench", "search", "--chunks", "3000", "--collections", str(EVAL),
            "--keep", str(kept), timeout=120,
        )  # fmt: skip
        assert both.returncode != 0
        assert "give --topology too" in both.output
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_bench_search_refuses_an_hnsw_sweep_it_cannot_build() -> None:
    result = run_kops(
        "bench", "search", "--chunks", "100", "--collections", str(EVAL), "--hnsw-sweep", "16:8",
        timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "'16:8' is not M:EF_CONSTRUCTION" in result.output
    assert "pgvector's limits" in result.output
