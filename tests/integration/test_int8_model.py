"""KOPS_MODEL_VARIANT=int8: the model quantised per channel and run by ONNX Runtime is built
once from the shipped weights, checked against fp32 on real text, reused, and serves a real
runtime end to end."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from knowledgeops.errors import ModelCheckFailed
from knowledgeops.ingest.embedders import onnx_int8
from knowledgeops.ingest.embedders.local import DIMENSION, LocalMiniLM
from knowledgeops.ingest.embedders.onnx_int8 import (
    INT8_MODEL_ID,
    MIN_MEAN_COSINE,
    OnnxMiniLM,
    calibration_texts,
)
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from tests.integration.test_exactly_once import done, upload

pytestmark = pytest.mark.model

# real paragraphs that are not in the calibration text (Apache License 2.0, MIT, README prose)
HELD_OUT = [
    "Subject to the terms and conditions of this License, each Contributor hereby grants to You "
    "a perpetual, worldwide, non-exclusive, no-charge, royalty-free, irrevocable copyright "
    "license to reproduce, prepare Derivative Works of, publicly display, publicly perform, "
    "sublicense, and distribute the Work and such Derivative Works in Source or Object form.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
    "software and associated documentation files, to deal in the Software without restriction.",
    "Upload a document and the service answers at once with a job id; workers parse, chunk and "
    "embed it, and the job shows honest counts until its chunks are searchable.",
    "知识管理系统可以解析各种文档格式，上传文件以后系统会自动分块、嵌入并建立索引。",
    "Volcanoes form where molten rock from deep inside the Earth finds a way to the surface.",
]


@pytest.fixture(scope="module")
def int8(tmp_path_factory: pytest.TempPathFactory) -> OnnxMiniLM:
    model = OnnxMiniLM(tmp_path_factory.mktemp("models"), threads=2)
    model.load()
    return model


def test_the_build_passed_its_check_and_is_kept(int8: OnnxMiniLM) -> None:
    report = json.loads(int8.path.with_suffix(".json").read_text())
    assert report["texts"] == len(calibration_texts()) >= 40
    assert report["mean_cosine"] >= MIN_MEAN_COSINE
    assert int8.path.stat().st_size < 30 * 2**20  # int8 weights: about a quarter of fp32's
    again = OnnxMiniLM(int8.folder, threads=2)
    mtime = int8.path.stat().st_mtime_ns
    again.load()  # reused, not rebuilt
    assert int8.path.stat().st_mtime_ns == mtime


def test_vectors_stay_close_to_fp32_on_text_it_was_not_checked_on(int8: OnnxMiniLM) -> None:
    fp32 = LocalMiniLM(threads=2)
    got, expected = int8.embed(HELD_OUT), fp32.embed(HELD_OUT)
    assert got.shape == (len(HELD_OUT), DIMENSION)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosine = (got * expected).sum(axis=1)
    assert cosine.mean() >= MIN_MEAN_COSINE
    assert cosine.min() >= 0.97
    # and meaning still ranks: the licence grant is nearer the MIT permission than volcanoes
    assert float(got[0] @ got[1]) > float(got[0] @ got[4])


def test_a_runtime_on_the_int8_variant_ingests_and_searches(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path, int8: OnnxMiniLM
) -> None:
    runtime = make_runtime(start=False, from_settings="local", model_variant="int8")
    models = runtime.settings.data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    for built in (int8.path, int8.path.with_suffix(".json")):  # no second build
        (models / built.name).write_bytes(built.read_bytes())
    runtime.start()
    body = "\n\n".join(HELD_OUT)
    job = done(runtime, upload(runtime, tmp_path, "mixed.txt", body).id)
    assert job.total_chunks
    dataset = runtime.service.datasets.get("default", job.dataset_id)
    assert dataset.embedding_model == INT8_MODEL_ID
    hits = runtime.service.search.search(
        "default", job.dataset_id, "erupting mountains of lava", mode=SearchMode.VECTOR, top_k=1
    )
    assert "Volcanoes" in hits[0].text


def test_a_build_that_fails_its_check_stops_the_start_and_is_not_kept(
    make_runtime: Callable[..., EmbeddedRole], monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr(onnx_int8, "MIN_MEAN_COSINE", 1.01)  # no quantised model can reach it
    builds = []
    real_build = onnx_int8.build
    monkeypatch.setattr(onnx_int8, "build", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    runtime = make_runtime(start=False, from_settings="local", model_variant="int8")
    with pytest.raises(ModelCheckFailed, match="KOPS_MODEL_VARIANT=fp32"):
        runtime.start()
    runtime.started_at = None
    models = runtime.settings.data_dir / "models"
    assert not list(models.glob("*.onnx"))
    assert not list(models.glob("*.json"))
    assert not list(models.glob(".build-*"))  # the work folder went with the failure
    model = runtime.embedder.for_queries()
    assert isinstance(model, OnnxMiniLM)
    with pytest.raises(ModelCheckFailed):
        model.load()  # remembered: not built again per call
    assert builds == [1]
