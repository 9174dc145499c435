"""Small real documents on distinct topics for the end-to-end tests, written with the builders of
tests/fixtures/documents.py, and the questions that should find them (worded unlike the text)."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.documents import (
    Heading,
    Para,
    Table,
    make_docx,
    make_html,
    make_markdown,
    make_pdf,
    make_text,
)

PDF_PAGES = (
    # page 1: how volcanoes form
    "Volcanoes form where molten rock from deep inside the Earth finds a way to the surface. "
    "Most of them sit along the edges of tectonic plates. At subduction zones one oceanic plate "
    "sinks beneath another, the descending slab releases water, and the mantle above it melts. "
    "The magma rises because it is lighter than the solid rock around it and collects in a "
    "magma chamber a few kilometres below the summit. Other volcanoes grow above hotspots, "
    "plumes of hot mantle that stay in place while a plate drifts over them; the islands of "
    "Hawaii are a chain of shield volcanoes made this way. Basaltic magma is runny and builds "
    "broad gentle cones, while sticky magma rich in silica builds steep stratovolcanoes.",
    # page 2: monitoring and forecasting eruptions
    "Volcanologists watch restless volcanoes with networks of instruments to forecast "
    "eruptions. Seismometers record swarms of small earthquakes as magma cracks its way "
    "upward. Tiltmeters and GPS stations measure how the ground swells when the magma chamber "
    "inflates. Gas sensors track the release of sulfur dioxide and carbon dioxide, which rises "
    "before many eruptions. Satellites with radar interferometry map uplift of a few "
    "centimetres over whole mountains. When these signals grow together, observatories raise "
    "the alert level and civil authorities may evacuate the villages on the flanks of the "
    "volcano. Forecasts remain uncertain, but warnings have saved many thousands of lives.",
    # page 3: famous eruptions
    "Some eruptions changed history. In the year 79 Mount Vesuvius buried the Roman towns of "
    "Pompeii and Herculaneum under ash and pyroclastic flows, preserving bodies, bread and "
    "frescoes for archaeologists. The explosion of Krakatoa in 1883 was heard thousands of "
    "kilometres away and its tsunamis killed tens of thousands of people. Tambora in 1815 threw "
    "so much sulfur into the stratosphere that 1816 became the year without a summer in Europe "
    "and North America, with failed harvests and famine. Mount Pinatubo in 1991 cooled the "
    "whole planet by about half a degree for two years.",
)

HTML_BODY = """\
<h1>The life of a honeybee colony</h1>
<p>A honeybee colony is a superorganism of up to sixty thousand workers, a few hundred drones
and a single queen. The queen lays up to two thousand eggs a day in the wax cells of the comb.
Worker bees change jobs as they age: young workers clean cells and feed larvae with royal jelly,
middle-aged bees build comb and guard the entrance, and the oldest fly out as foragers.</p>
<h2>Foraging and the waggle dance</h2>
<p>A forager that finds a rich patch of flowers returns to the hive and performs the waggle
dance on the comb. The angle of the dance relative to vertical tells her sisters the direction
of the flowers relative to the sun, and the length of the waggle run tells the distance.
Foragers collect nectar, which the colony evaporates into honey, and pollen, which feeds the
brood.</p>
<h2>Swarming</h2>
<p>In spring a crowded colony raises new queens and the old queen leaves with half of the
workers in a swarm. Scout bees search for a hollow tree and the swarm decides by consensus.</p>
<script>window.analytics = {track: function () { return "pageview"; }};</script>
"""

DOCX_PARTS = (
    Heading("Baking sourdough bread", 0),
    Para(
        "Sourdough bread is leavened by a starter, a culture of wild yeasts and lactic acid "
        "bacteria kept alive in a paste of flour and water. The bacteria give the loaf its "
        "tangy flavour and the yeasts make the dough rise slowly."
    ),
    Heading("Feeding the starter", 1),
    Para(
        "Feed the starter once or twice a day with equal weights of flour and water. A healthy "
        "starter doubles in volume within six hours and smells pleasantly sour, like yoghurt."
    ),
    Heading("Hydration", 1),
    Para("The share of water relative to flour decides how open the crumb will be."),
    Table(
        [
            ["Loaf", "Water per 100 g flour", "Crumb"],
            ["Sandwich loaf", "65 g", "tight"],
            ["Country loaf", "75 g", "open"],
            ["Ciabatta", "85 g", "very open"],
        ]
    ),
    Heading("Shaping and baking", 1),
    Para(
        "After the bulk fermentation, shape the dough into a tight boule, proof it overnight "
        "in the fridge, then bake it in a preheated Dutch oven at 250 degrees for twenty minutes "
        "with the lid on and twenty more with the lid off until the crust is deep brown."
    ),
)

MARKDOWN = """\
# Training for your first marathon

Running 42.195 kilometres takes about four months of preparation for a healthy beginner.

## Weekly mileage

Build the weekly distance slowly, by no more than ten percent a week, and take an easier
recovery week every fourth week. Most plans peak at fifty to sixty kilometres a week.

## The long run

Once a week, run slowly for a long time. The long run grows from fifteen to thirty-two
kilometres and teaches the legs and the heart to keep going for hours.

## Race day

- Eat a breakfast rich in carbohydrates three hours before the start.
- Start slower than goal pace; the last ten kilometres decide the race.
- Take an energy gel and water every forty minutes.
"""

LATIN1 = (
    "Making Camembert in Normandy\n\n"
    "Camembert de Normandie is a soft cheese with a bloomy white rind, made from raw cow's "
    "milk in fromageries around the village of Camembert. The milk is warmed to about 32 °C "
    "and curdled with rennet; the curd is ladled by hand into perforated moulds, a "
    "technique called moulage à la louche. After draining, the cheeses are salted and sprayed "
    "with Penicillium candidum, the white mould that grows into the crust. An affineur turns "
    "them in a cool cellar for three to four weeks until the heart is creamy, like crème "
    "fraîche. The région also gives Pont-l'Évêque and Livarot, and cidre and calvados are "
    "served beside the cheese on the plateau de fromages.\n"
)


@dataclass(frozen=True)
class Topic:
    file_name: str
    question: str  # a question about the topic that does not copy the document's sentences
    page: int | None = None  # for the PDF: the page that answers the question


TOPICS = (
    Topic(
        "volcanoes.pdf",
        "how do scientists predict that a volcanic mountain is about to erupt",
        page=2,
    ),
    Topic("sourdough.docx", "what is the right way to keep a bread leaven culture alive"),
    Topic("honeybees.html", "how do insects in a hive tell each other where the nectar is"),
    Topic("marathon.md", "how should a beginner prepare for a 42 km road race"),
    Topic("camembert.txt", "how is a soft French cheese with a white crust produced"),
)


def write_topics(folder: Path) -> dict[str, Path]:
    """Write one document per topic (PDF of 3 pages, DOCX with headings and a table, HTML with
    scripts and navigation, Markdown, Latin-1 text); returns them by file name."""
    folder.mkdir(parents=True, exist_ok=True)
    pages = ["\n".join(textwrap.wrap(page, 85)) for page in PDF_PAGES]
    return {
        "volcanoes.pdf": make_pdf(
            folder / "volcanoes.pdf", pages, header="Volcanoes", footer="Page {page} of {pages}"
        ),
        "sourdough.docx": make_docx(folder / "sourdough.docx", DOCX_PARTS),
        "honeybees.html": make_html(
            folder / "honeybees.html", HTML_BODY, title="Honeybees", chrome=True
        ),
        "marathon.md": make_markdown(folder / "marathon.md", MARKDOWN),
        "camembert.txt": make_text(folder / "camembert.txt", LATIN1, encoding="latin-1"),
    }


_WORDS = [
    "river",
    "harbour",
    "engine",
    "signal",
    "copper",
    "lantern",
    "meadow",
    "orbit",
    "violin",
    "granite",
    "saddle",
    "compass",
    "glacier",
    "ledger",
    "mirror",
    "pepper",
    "quarry",
    "rudder",
    "summit",
    "timber",
    "velvet",
    "walnut",
    "anchor",
    "beacon",
    "canvas",
    "dynamo",
    "ember",
    "falcon",
    "garnet",
    "hollow",
    "island",
    "jasmine",
    "kettle",
    "lumber",
    "marble",
    "nectar",
    "oyster",
    "pylon",
    "quartz",
    "raven",
    "spindle",
    "tundra",
    "umber",
    "vessel",
    "willow",
    "yarrow",
    "zephyr",
    "basalt",
    "cedar",
    "delta",
    "fjord",
]


def long_text(tag: str, paragraphs: int, seed: int) -> str:
    """Distinct filler text in which every sentence names `tag` (a word found in no other
    document), so that a keyword search for `tag` finds every chunk of this document."""
    rng = random.Random(seed)
    out = []
    for p in range(paragraphs):
        sentences = []
        for _ in range(6):
            words = rng.sample(_WORDS, 9)
            sentences.append(f"The {tag} {' '.join(words)} number {rng.randrange(10_000)}.")
        out.append(f"Part {p + 1}. " + " ".join(sentences))
    return "\n\n".join(out) + "\n"
