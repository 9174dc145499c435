"""The catalogue of embedding models and how a process makes each model's embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from knowledgeops.db.engine import Database
from knowledgeops.errors import SettingsError
from knowledgeops.ingest.embedders.e5 import E5_MODEL_ID
from knowledgeops.ingest.embedders.local import MODEL_ID
from knowledgeops.ingest.embedders.models import UnknownModel
from knowledgeops.ingest.embedders.onnx_int8 import INT8_MODEL_ID
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles import wiring
from knowledgeops.settings import Settings


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path, embed_cache=False, **values)  # type: ignore[arg-type]


def test_the_catalogue_holds_the_local_models_and_the_default_follows_the_settings(
    tmp_path: Path, sqlite_db: Database
) -> None:
    models = wiring.make_models(settings(tmp_path), sqlite_db)
    assert {MODEL_ID, INT8_MODEL_ID} <= set(models.names)
    assert models.default == MODEL_ID
    assert models.spec(MODEL_ID).max_tokens == 256
    int8 = wiring.make_models(settings(tmp_path, model_variant="int8"), sqlite_db)
    assert int8.default == INT8_MODEL_ID
    chosen = wiring.make_models(settings(tmp_path, embedding_model=INT8_MODEL_ID), sqlite_db)
    assert chosen.default == INT8_MODEL_ID
    with pytest.raises(SettingsError, match=r"KOPS_EMBEDDING_MODEL='nope'.*all-MiniLM-L6-v2"):
        wiring.make_models(settings(tmp_path, embedding_model="nope"), sqlite_db)


def test_a_model_is_made_once_on_first_use_and_unknown_ones_are_named(
    tmp_path: Path, sqlite_db: Database
) -> None:
    models = wiring.make_models(settings(tmp_path), sqlite_db)
    first = models.embedder(MODEL_ID)
    assert models.embedder(MODEL_ID) is first
    assert not first.loaded  # made, not loaded: loading waits for the first text
    with pytest.raises(UnknownModel, match=r"the available models are .*all-MiniLM-L6-v2"):
        models.embedder("bert-base-uncased")
    assert models.tokenizer(MODEL_ID) is models.tokenizer(MODEL_ID)
    models.close()


def test_a_given_embedder_is_the_only_model(tmp_path: Path, sqlite_db: Database) -> None:
    models = wiring.make_models(settings(tmp_path), sqlite_db, HashingEmbedder(dimension=32))
    assert models.names == [HashingEmbedder.model_id]
    assert models.embedder(models.default).dimension == 32


def test_only_models_of_the_index_dimension_can_be_chosen(
    tmp_path: Path, sqlite_db: Database
) -> None:
    provider = settings(tmp_path, embedder="openai", openai_dimensions=1536, openai_api_key="k")
    models = wiring.make_models(provider, sqlite_db)
    assert models.names == ["text-embedding-3-small"]  # the local 384-dimension ones are not
    assert E5_MODEL_ID in wiring.make_models(settings(tmp_path), sqlite_db).names
