"""The bundled offline dataset: 24 rows that run end to end with ``demo`` and ``rules``.

It mixes the kinds of the bundled examples — haiku (line and syllable counts, a required
word), one-sentence summaries (sentence count, required terms), short answers (a word limit, a
required term) and JSON replies (valid JSON, a required key) — so a newcomer with no key sees a
whole experiment. Every row has its own rubric. The demo worker (`rubric_core.offline.demo`)
knows each row: its first draft breaks one or two criteria, and each revision fixes the parts
whose criteria the grader's feedback names, so rows end ``satisfied`` after one or two
revisions, as the bundled examples do.

A row's answer is a list of parts; each part is ``(draft, fixed, criterion)``: the draft text,
the text once the criterion at that 0-based rubric index was reported failing, and the index
(None for a part that never changes).
"""

from __future__ import annotations

import dataclasses

from rubric_core.datasets import Dataset, DatasetRow

Part = tuple[str, str, int | None]


@dataclasses.dataclass(frozen=True)
class DemoRow:
    """One bundled row and the demo worker's script for it."""

    id: str
    kind: str
    topic: str
    prompt: str
    rubric: str
    parts: tuple[Part, ...]

    def answer(self, fixed: frozenset[int]) -> str:
        """The answer with the parts of the ``fixed`` criteria (0-based indexes) fixed."""
        return "".join(fix if index is not None and index in fixed else draft
                       for draft, fix, index in self.parts)


_HAIKU_RUBRIC = ("- The poem has three lines\n- Lines follow a 5-7-5 syllable pattern\n"
                 "- The poem mentions {word}")


def _haiku(row_id: str, topic: str, word: str, line1: tuple[str, str], line2: tuple[str, str],
           line3: str) -> DemoRow:
    return DemoRow(
        row_id, "haiku", topic,
        f"Write a haiku about {topic}. Reply with the three lines of the poem only.",
        _HAIKU_RUBRIC.format(word=word),
        ((line1[0], line1[1], 2), ("\n", "\n", None), (line2[0], line2[1], 1),
         ("\n" + line3, "\n" + line3, None)),
    )


def _summary(row_id: str, topic: str, terms: tuple[str, str], head: tuple[str, str],
             tail: tuple[str, str]) -> DemoRow:
    return DemoRow(
        row_id, "summary", topic, f"Write a one-sentence summary of {topic}.",
        f"- The answer is one sentence\n- The answer mentions {terms[0]} and {terms[1]}",
        ((head[0], head[1], 1), (tail[0], tail[1], 0)),
    )


def _short(row_id: str, topic: str, question: str, term: str, draft: str, fixed: str) -> DemoRow:
    return DemoRow(
        row_id, "short answer", topic, f"In at most 15 words, {question}",
        f"- The answer has at most 15 words\n- The answer mentions {term}",
        ((draft, fixed, 0),),
    )


def _json(row_id: str, topic: str, record: str) -> DemoRow:
    return DemoRow(
        row_id, "json", topic,
        f"Return a JSON object describing {topic} with the keys name and price. Reply with the "
        "JSON only.",
        "- The answer is valid JSON\n- The answer contains \"price\"",
        ((f"Here is the record:\n\n```json\n{record}\n```", record, 0),),
    )


DEMO_ROWS: tuple[DemoRow, ...] = (
    _haiku("haiku-autumn", "autumn", "autumn",
           ("Dry leaves drifting down", "Autumn leaves drift down"),
           ("red and gold across the quiet lane", "red and gold across the lane"),
           "the old oak stands bare"),
    _haiku("haiku-winter", "winter", "snow", ("Winter frost falls soft", "Winter snow falls soft"),
           ("white fields sleep beneath the silver moon", "white fields sleep beneath the moon"),
           "a fox crosses home"),
    _haiku("haiku-summer", "summer", "summer", ("Warm sun climbing high", "Summer sun climbs high"),
           ("children splash in the cool river stream", "children splash in the cool stream"),
           "bees hum in clover"),
    _haiku("haiku-harbor", "a harbor at dawn", "harbor",
           ("Morning mist hangs low", "Morning mist hangs low"),
           ("the harbor waits for the fishing boats", "the harbor waits for the boats"),
           "gulls cry overhead"),
    _haiku("haiku-desert", "the desert", "desert",
           ("Dry wind blowing hot", "Desert wind blows hot"),
           ("sand dunes shift beneath the burning sky", "dunes drift beneath the pale sky"),
           "a lizard keeps still"),
    _haiku("haiku-mountain", "a mountain", "mountain",
           ("High peaks standing tall", "Mountain peaks stand tall"),
           ("thin clouds drift across the rocky ridge", "clouds drift across the high ridge"),
           "an eagle circles"),
    _haiku("haiku-city", "a city at night", "city",
           ("Bright lights glowing late", "City lights glow bright"),
           ("taxis hurry through the crowded streets", "taxis rush through crowded streets"),
           "night never ends here"),
    _haiku("haiku-ocean", "the ocean", "ocean", ("Blue waves rolling in", "Ocean waves roll in"),
           ("salt spray rises over the dark rocks", "salt spray rises over rocks"),
           "the tide pulls away"),
    _summary("summary-water-cycle", "the water cycle", ("evaporation", "condensation"),
             ("The water cycle moves water from oceans into the air and back as rain",
              "The water cycle moves water by evaporation from oceans, condensation into "
              "clouds and rain back to the ground"),
             (". It never stops.", ", and it never stops.")),
    _summary("summary-plate-tectonics", "plate tectonics", ("plates", "earthquakes"),
             ("Plate tectonics explains how the crust slowly moves over the mantle",
              "Plate tectonics explains how the crust's plates slowly move over the mantle and "
              "cause earthquakes where they meet"),
             (". This shapes continents.", ", which shapes continents.")),
    _summary("summary-vaccines", "how vaccines work", ("immune system", "antibodies"),
             ("Vaccines show the body a harmless piece of a germ",
              "Vaccines show the immune system a harmless piece of a germ so it makes "
              "antibodies in advance"),
             (". Later infections are then fought off quickly.",
              ", so later infections are fought off quickly.")),
    _summary("summary-french-revolution", "the French Revolution", ("1789", "monarchy"),
             ("The French Revolution overturned the old order in France",
              "The French Revolution, begun in 1789, overturned the monarchy and the old order "
              "in France"),
             (". It spread new ideas of rights.", " and spread new ideas of rights.")),
    _summary("summary-black-holes", "black holes", ("gravity", "light"),
             ("Black holes are regions of space where matter is packed very densely",
              "Black holes are regions of space where gravity is so strong that not even light "
              "escapes"),
             (". They form when huge stars collapse.", ", formed when huge stars collapse.")),
    _summary("summary-inflation", "inflation", ("prices", "money"),
             ("Inflation is a general rise over time in what things cost",
              "Inflation is a general rise in prices over time, so the same money buys less"),
             (". Central banks try to keep it low.", ", which central banks try to keep low.")),
    _summary("summary-dna", "DNA", ("genes", "proteins"),
             ("DNA is the molecule that carries the instructions of living things",
              "DNA is the molecule whose genes carry the instructions for building the proteins "
              "of living things"),
             (". It is shaped like a twisted ladder.", ", shaped like a twisted ladder.")),
    _short("short-sky", "why the sky is blue", "explain why the sky is blue.", "scattering",
           "The sky looks blue because sunlight is made of many colours and the air around the "
           "planet bends the short blue waves far more than the others, all day long.",
           "Air molecules scatter blue sunlight more than red; that scattering colours the sky."),
    _short("short-seasons", "why we have seasons", "explain why Earth has seasons.", "tilt",
           "Earth has seasons because as it travels around the Sun over a year, different parts "
           "of the planet receive more or less direct sunlight at different times.",
           "Earth's axial tilt changes how directly sunlight reaches each hemisphere through the "
           "year."),
    _short("short-tides", "what causes tides", "say what causes ocean tides.", "Moon",
           "Ocean tides happen because a large body near the Earth pulls on the water of the "
           "oceans, so the sea rises and falls twice each day on most coasts.",
           "The Moon's gravity pulls the oceans, raising tides twice a day."),
    _short("short-rainbow", "rainbows", "explain how a rainbow forms.", "refraction",
           "A rainbow forms when sunlight passes through falling raindrops in the air and comes "
           "back out split into a band of colours that we can see from the ground.",
           "Refraction in raindrops splits sunlight into its colours, forming a rainbow."),
    _short("short-bread", "why bread rises", "explain why bread dough rises.", "yeast",
           "Bread dough rises because tiny living things mixed into it eat the sugars and give "
           "off gas, which gets trapped in the dough and makes it swell up slowly.",
           "Yeast eats sugars and releases gas that gets trapped, so the dough rises."),
    _json("json-lamp", "a desk lamp",
          '{"name": "Arc Desk Lamp", "price": 39.5, "currency": "EUR"}'),
    _json("json-kettle", "an electric kettle",
          '{"name": "Brew 1.7 L Kettle", "price": 29.99, "currency": "EUR"}'),
    _json("json-backpack", "a hiking backpack",
          '{"name": "Ridge 30 Backpack", "price": 74.0, "currency": "EUR"}'),
    _json("json-mug", "a ceramic mug",
          '{"name": "Stone Mug 350 ml", "price": 12.5, "currency": "EUR"}'),
)
"""Every bundled row, in dataset order."""

DEMO_DATASET_NAME = "bundled-demo"
"""The name the bundled dataset is stored under."""


def demo_row_for(prompt: str) -> DemoRow | None:
    """The bundled row whose prompt this is (whitespace aside), or None."""
    squeezed = " ".join(prompt.split())
    return next((r for r in DEMO_ROWS if " ".join(r.prompt.split()) == squeezed), None)


def demo_dataset() -> Dataset:
    """The bundled rows as a `Dataset` (with ``kind`` and ``topic`` as variables)."""
    rows = tuple(DatasetRow(id=r.id, prompt=r.prompt, rubric=r.rubric,
                            variables={"kind": r.kind, "topic": r.topic}) for r in DEMO_ROWS)
    return Dataset(DEMO_DATASET_NAME, ("id", "prompt", "rubric", "kind", "topic"), rows)
