"""`kops eval`: retrieval quality, measured the way `kops bench` measures speed (the lab)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from knowledgeops.cli.bench import lab
from knowledgeops.cli.common import console, err, fail
from knowledgeops.errors import LabError


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)


def _names(value: str, known: tuple[str, ...], option: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise fail(f"{option}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def evaluate(
    collections: Annotated[
        Path | None,
        typer.Option(
            help="The folder of judged collections (default: eval/ of the checkout found from "
            "the current folder up)."
        ),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Collections to run, by name or name prefix (repeat the option)."),
    ] = None,
    modes: Annotated[str, typer.Option(help="Search modes, comma-separated.")] = (
        "vector,keyword,hybrid"
    ),
    baselines: Annotated[
        str, typer.Option(help="Baselines, comma-separated: bm25, llamaindex; '' for none.")
    ] = "bm25,llamaindex",
    max_pages: Annotated[
        int | None, typer.Option(min=1, help="Only the first N pages of each collection.")
    ] = None,
    max_questions: Annotated[
        int | None, typer.Option(min=1, help="Only the first N questions of each collection.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="The datasets' embedding model, an id from GET /models (default: the "
            "deployment's default, KOPS_EMBEDDING_MODEL)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker threads of kops serve.")] = 2,
    require: Annotated[
        list[str] | None,
        typer.Option(
            help="A threshold COLLECTIONS:MODE:METRIC>=REF[+DELTA], e.g. '*:hybrid:mrr10>=0.85' "
            "or '*:hybrid:mrr10>=llamaindex+0.1' (repeat); exit 1 when one falls short."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the figures as JSON here.")] = None,
) -> None:
    """Ask every judged question in every mode of a fresh service and of two baselines; print
    R@1, R@5, MRR@10 and search latency per collection and mode."""
    run = lab("eval.run", needs=("bm25s",) if baselines.strip() else ())
    chosen_modes = _names(modes, run.MODES, "--modes")
    chosen_baselines = _names(baselines, run.BASELINES, "--baselines")
    if "llamaindex" in chosen_baselines:
        lab("eval.baselines", needs=("llama_index.core", "llama_index.readers.file"))
    try:
        requirements = [run.Requirement.parse(text) for text in require or []]
    except ValueError as exc:
        raise fail(f"--require: {exc}") from None
    found = lab("eval.collections")
    root = collections or found.find_root()
    if root is None:
        raise fail("no collections: run this in the checkout (it has eval/), or give --collections")
    try:
        chosen = found.load(root, only=only, max_pages=max_pages, max_questions=max_questions)
        report = run.run_eval(
            chosen,
            modes=chosen_modes,
            with_baselines=chosen_baselines,
            model=model,
            workers=workers,
            say=lambda line: err.print(escape(line), highlight=False),
        )
    except LabError as exc:
        raise fail(str(exc)) from None
    console.print(escape(run.render(report)), highlight=False, soft_wrap=True)
    if out is not None:
        run.write_json(report, out)
    short = [line for requirement in requirements for line in requirement.check(report)]
    for line in short:
        err.print(f"[red]below the threshold[/red] {escape(line)}")
    if short:
        raise typer.Exit(1)
