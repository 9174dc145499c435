"""`kops bench ocr`: how well and how fast scans are read, and what it costs.

- **Accuracy**: pages whose text is known, rendered to 200 dpi images (what a scanner gives) and
  degraded copies of them (a rotation of about a degree, blur, noise, JPEG artefacts): English
  from the book's PDF (its text layer is the truth), Chinese from the project's Chinese course
  notes typeset with a CJK font. Character error rate = edit distance / length, whitespace
  ignored, for each engine measured here: RapidOCR (the product's) and, when its binary is
  installed, Tesseract.
- **Speed**: the engine alone on the page images, pages/s; then the same pages as a scanned PDF
  through `kops serve` (upload to completed), with one worker and with two (the PDF split into
  page-range parts that both take), pages/s each.
- **Memory**: the peak RSS of the parser processes while they read the scan, sampled.
"""

from __future__ import annotations

import io
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pypdfium2 as pdfium
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from knowledgeops.errors import LabError
from knowledgeops.ingest.parsers import tesseract
from knowledgeops.ingest.parsers.ocr import read_image
from knowledgeops.ingest.parsers.pdf import OCR_DPI
from knowledgeops.lab.bench.endtoend import EmbeddedServer, connect
from knowledgeops.lab.bench.memory import children, rss_mb

CJK_FONTS = (
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
)
A4_PX = (1654, 2339)  # A4 at 200 dpi
SAMPLE_PERIOD_S = 0.2


@dataclass
class EngineAccuracy:
    engine: str
    language: str
    pages: int
    cer_clean: float
    cer_degraded: float
    seconds_per_page: float


@dataclass
class OcrFigures:
    accuracy: list[EngineAccuracy] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    scan_pages: int = 0
    engine_pages_per_s: float = 0.0
    end_to_end: dict[str, float] = field(default_factory=dict)  # "1 worker" → pages/s
    ratio_end_to_end_to_engine: float = 0.0
    two_workers_speedup: float = 0.0
    parser_peak_rss_mb: float = 0.0


def cer(truth: str, read: str) -> float:
    from rapidfuzz.distance import Levenshtein  # noqa: PLC0415 (the bench extra)

    a, b = "".join(truth.split()), "".join(read.split())
    distance: int = Levenshtein.distance(a, b)
    return distance / max(len(a), 1)


def degrade(image: Image.Image, seed: int = 1) -> Image.Image:
    """A photocopy-like copy: rotated by up to 1.2°, blurred, speckled, saved as a poor JPEG."""
    rng = random.Random(seed)
    out = image.rotate(rng.uniform(-1.2, 1.2), resample=Image.Resampling.BICUBIC, fillcolor=255)
    out = out.filter(ImageFilter.GaussianBlur(0.6))
    pixels = np.asarray(out, dtype=np.int16)
    noise = np.random.default_rng(seed).normal(0, 14, pixels.shape)
    out = Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    out.save(buffer, "JPEG", quality=55)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("L")


def english_pages(book: Path, count: int, first: int = 40) -> list[tuple[str, Image.Image]]:
    """`count` pages of the book spread over it: (text layer, 200 dpi grey image)."""
    pdf = pdfium.PdfDocument(str(book))
    try:
        first = min(first, max(0, len(pdf) - count))  # a short book: from its start
        step = max(1, (len(pdf) - first) // count)
        out = []
        for index in range(first, len(pdf), step)[:count]:
            page = pdf[index]
            textpage = page.get_textpage()
            text = textpage.get_text_range()
            textpage.close()
            image = page.render(scale=OCR_DPI / 72, grayscale=True).to_pil().convert("L")
            page.close()
            out.append((text, image))
        return out
    finally:
        pdf.close()


def cjk_font() -> Path | None:
    return next((Path(p) for p in CJK_FONTS if Path(p).is_file()), None)


def chinese_pages(seeds: Path, count: int, font: Path) -> list[tuple[str, Image.Image]]:
    """The course notes' lines typeset on A4 pages at 200 dpi in 11-point type."""
    lines = [
        line.strip()
        for path in sorted(seeds.glob("*.txt"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if len(line.strip()) >= 6
    ]
    face = ImageFont.truetype(str(font), 31)  # 11 pt at 200 dpi
    margin, step, width = 150, 48, 30  # px, px per line, characters per line
    pages: list[tuple[str, Image.Image]] = []
    cursor = 0
    for _ in range(count):
        image = Image.new("L", A4_PX, 255)
        draw = ImageDraw.Draw(image)
        y, written = margin, []
        while y < A4_PX[1] - margin and cursor < len(lines):
            line = lines[cursor][:width]
            cursor += 1
            draw.text((margin, y), line, font=face, fill=0)
            written.append(line)
            y += step
        pages.append(("\n".join(written), image))
    return pages


def _accuracy(engine: str, language: str, pages: list[tuple[str, Image.Image]]) -> EngineAccuracy:
    clean: list[float] = []
    degraded: list[float] = []
    seconds = 0.0
    for n, (truth, image) in enumerate(pages):
        for target, picture in ((clean, image), (degraded, degrade(image, n))):
            began = time.perf_counter()
            if engine == "rapidocr":
                text = read_image(np.asarray(picture)).text
            else:
                text = tesseract.read_image(np.asarray(picture), (language,)).text
            if target is clean:
                seconds += time.perf_counter() - began
            target.append(cer(truth, text))
    return EngineAccuracy(
        engine,
        language,
        len(pages),
        round(float(np.mean(clean)), 4),
        round(float(np.mean(degraded)), 4),
        round(seconds / len(pages), 2),
    )


def scanned_pdf(images: list[Image.Image], out: Path) -> Path:
    """The page images as a PDF without a text layer (as a scanner makes it)."""
    from reportlab.lib.pagesizes import A4  # noqa: PLC0415 (the bench extra)
    from reportlab.lib.utils import ImageReader  # noqa: PLC0415
    from reportlab.pdfgen import canvas  # noqa: PLC0415

    pdf = canvas.Canvas(str(out), pagesize=A4, invariant=1)
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, "PNG", optimize=True)
        pdf.drawImage(ImageReader(io.BytesIO(buffer.getvalue())), 0, 0, *A4)
        pdf.showPage()
    pdf.save()
    return out


class _PeakRss:
    """Samples the RSS of `pid`'s parser processes (its children) until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD_S):
            for child in children(self.pid):
                self.peak = max(self.peak, rss_mb(child))

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _end_to_end(pdf: Path, pages: int, workers: int, part_pages: int) -> tuple[float, float]:
    """pages/s from upload to completed, and the parsers' peak RSS (MB)."""
    env = {"KOPS_PDF_PART_PAGES": str(part_pages)}
    with (
        EmbeddedServer(workers=workers, env=env) as server,
        connect(server.url, server.started, server.log) as (client, _),
    ):
        assert server.process is not None
        with _PeakRss(server.process.pid) as rss:
            began = time.perf_counter()
            job = _upload(client, pdf)
            _wait(client, job, timeout_s=60 + 60 * pages)
            seconds = time.perf_counter() - began
        return pages / seconds, rss.peak


def _upload(client: httpx.Client, pdf: Path) -> str:
    with pdf.open("rb") as fh:
        answer = client.post("/docs/upload", files={"file": (pdf.name, fh, "application/pdf")})
    answer.raise_for_status()
    return str(answer.json()["jobId"])


def _wait(client: httpx.Client, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/docs/jobs/{job_id}").json()
        if job["status"] in ("completed", "failed", "cancelled"):
            if job["status"] != "completed":
                raise LabError(f"the scanned PDF did not complete: {job.get('error')}")
            return job
        time.sleep(0.5)
    raise LabError(f"the scanned PDF was not done within {timeout_s:.0f} s")


def run_ocr_bench(
    book: Path, seeds: Path | None, *, accuracy_pages: int, scan_pages: int
) -> OcrFigures:
    figures = OcrFigures(scan_pages=scan_pages)
    english = english_pages(book, accuracy_pages)
    samples = {"en": english}
    font = cjk_font()
    if seeds is not None and font is not None:
        samples["zh"] = chinese_pages(seeds, accuracy_pages, font)
    else:
        figures.skipped.append(
            "Chinese: no CJK font (apt-get install fonts-wqy-microhei) or no seeds folder"
        )
    for language, pages in samples.items():
        figures.accuracy.append(_accuracy("rapidocr", language, pages))
        if language in tesseract.available_languages():
            figures.accuracy.append(_accuracy("tesseract", language, pages))
        else:
            figures.skipped.append(f"Tesseract {language}: not installed")
    # speed: the engine alone, then the service, on the same page images
    images = [image for _, image in english_pages(book, scan_pages, first=20)]
    began = time.perf_counter()
    for image in images:
        read_image(np.asarray(image))
    figures.engine_pages_per_s = round(len(images) / (time.perf_counter() - began), 3)
    with tempfile.TemporaryDirectory(prefix="kops-bench-ocr-") as folder:
        pdf = scanned_pdf(images, Path(folder) / "scan.pdf")
        one, peak_one = _end_to_end(pdf, len(images), workers=1, part_pages=0)
        part = max(1, len(images) // 8)
        two, peak_two = _end_to_end(pdf, len(images), workers=2, part_pages=part)
    figures.end_to_end = {"1 worker": round(one, 3), "2 workers": round(two, 3)}
    figures.ratio_end_to_end_to_engine = round(one / figures.engine_pages_per_s, 3)
    figures.two_workers_speedup = round(two / one, 3)
    figures.parser_peak_rss_mb = round(max(peak_one, peak_two), 1)
    return figures
