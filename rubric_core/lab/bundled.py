"""The bundled labelled answer set: 32 one-sentence answers about plants, labelled by two people.

It lets a newcomer with no key do the whole lab loop offline: import it, re-grade it with
`BUNDLED_RUBRIC` and the ``rules`` grader, see criterion health flag the weak criterion, ask
the demo refiner (`rubric_core.lab.refine.DemoRefiner`) for a rewrite, accept one and see κ
with people's verdicts rise.

The request is the same for every answer: explain, in one sentence, how plants make their
food. People (Ana and Ben) gave a pass/fail verdict on each of the four criteria of
`BUNDLED_RUBRIC` for every answer, reading each criterion as its author meant it:

1. "The answer is one sentence": they agree with a sentence count.
2. "The answer mentions sunlight": they pass any mention of the light the plant uses (light,
   the sun, sunshine), not only the word "sunlight"; they fail moonlight. The ``rules`` grader
   reads the criterion literally (the word "sunlight"), so it disagrees with them often: this
   is the weak criterion, too strict as worded. Ana and Ben themselves disagree on "daylight".
3. "The answer mentions carbon dioxide and water": they also pass "CO2".
4. "The answer is at most 60 words": every answer is far shorter, so it never fails and does
   not discriminate.

The verdicts are data written by hand, not computed by any rule.
"""

from __future__ import annotations

from rubric_core.lab.answers import AnswerSet
from rubric_core.store import AnswerItem, ItemLabel

BUNDLED_NAME = "bundled"
"""The name the bundled set is stored (and asked for) under."""

BUNDLED_RUBRIC_NAME = "bundled-plants"
"""The name the bundled rubric is saved under in the rubric library."""

BUNDLED_REQUEST = "In one sentence, explain to a ten-year-old how plants make their food."
"""The request every bundled answer was written for."""

CRITERIA = (
    "The answer is one sentence",
    "The answer mentions sunlight",
    "The answer mentions carbon dioxide and water",
    "The answer is at most 60 words",
)
"""The bundled rubric's criteria, in order (the labels' criterion names)."""

BUNDLED_RUBRIC = "".join(f"- {c}\n" for c in CRITERIA)
"""Version 1 of the bundled rubric, as a person first wrote it."""

LABELLERS = ("Ana", "Ben")
"""The two people who labelled every answer."""

# (id, answer, Ana's verdicts, Ben's verdicts): one character per criterion of CRITERIA, in
# order, "1" pass and "0" fail.
_ANSWERS: tuple[tuple[str, str, str, str], ...] = (
    ("a01", "Plants use sunlight, water and carbon dioxide to make sugar for food.",
     "1111", "1111"),
    ("a02", "Plants catch light with their green leaves and turn water and carbon dioxide into "
     "sugar.", "1111", "1111"),
    ("a03", "Using energy from the sun, plants turn carbon dioxide and water into sugar and "
     "oxygen.", "1111", "1111"),
    ("a04", "Plants make food from water and carbon dioxide. They need sunlight to do it.",
     "0111", "0111"),
    ("a05", "Plants drink water through their roots and make food in their leaves.",
     "1001", "1001"),
    ("a06", "Leaves soak up sunshine and use it to mix water with carbon dioxide into sugar.",
     "1111", "1111"),
    ("a07", "Plants take in carbon dioxide from the air and water from the soil, and with "
     "sunlight they make glucose.", "1111", "1111"),
    ("a08", "Plants eat soil to grow big and strong.", "1001", "1001"),
    ("a09", "With the help of light, a plant turns air and water into food.", "1101", "1101"),
    ("a10", "Plants make their own food using sunlight in a process called photosynthesis.",
     "1101", "1101"),
    ("a11", "The sun gives plants energy, which they use to build sugar from carbon dioxide "
     "and water.", "1111", "1111"),
    ("a12", "Green plants use sunlight to change water and carbon dioxide into food. Oxygen is "
     "left over.", "0111", "0111"),
    ("a13", "Plants make food at night from moonlight, water and carbon dioxide.",
     "1011", "1011"),
    ("a14", "Chlorophyll in leaves captures light so the plant can turn carbon dioxide and "
     "water into sugar.", "1111", "1111"),
    ("a15", "Plants get their food from the fertilizer farmers give them.", "1001", "1001"),
    ("a16", "Plants use sunlight, air and rain to make food.", "1101", "1101"),
    ("a17", "A plant uses light energy to join carbon dioxide and water into sugar that feeds "
     "it.", "1111", "1111"),
    ("a18", "Plants make food. They use water. They use carbon dioxide. They use sunlight.",
     "0111", "0111"),
    ("a19", "In daylight, leaves turn carbon dioxide and water into sugar.", "1111", "1011"),
    ("a20", "Sunlight lets leaves turn carbon dioxide and water into the sugar a plant lives "
     "on.", "1111", "1111"),
    ("a21", "Plants breathe in oxygen and breathe out carbon dioxide.", "1001", "1001"),
    ("a22", "Leaves use light from the sun to make sugar out of water and carbon dioxide.",
     "1111", "1111"),
    ("a23", "Plants use sunlight to make food out of water and carbon dioxide from the air.",
     "1111", "1111"),
    ("a24", "When the sun shines, plants use water and carbon dioxide to make sugar.",
     "1111", "1111"),
    ("a25", "Plants grow toward the window.", "1001", "1001"),
    ("a26", "Plants make sugar from carbon dioxide and water using light, and they release "
     "oxygen.", "1111", "1111"),
    ("a27", "Plants use sunlight and water to make food.", "1101", "1101"),
    ("a28", "Tiny parts of the leaf trap sunshine and use it with water and carbon dioxide to "
     "make food for the plant.", "1111", "1111"),
    ("a29", "Plants need light. They turn carbon dioxide and water into sugar.",
     "0111", "0111"),
    ("a30", "The sun helps plants grow.", "1101", "1101"),
    ("a31", "Plants turn CO2 and water into sugar using sunlight.", "1111", "1111"),
    ("a32", "Plants use the light of the sun to change water and CO2 into food.",
     "1111", "1111"),
)


def bundled_answer_set() -> AnswerSet:
    """The bundled answer set (see the module docstring), with both people's verdicts."""
    items = tuple(AnswerItem(item_id, BUNDLED_REQUEST, answer, BUNDLED_RUBRIC, "bundled")
                  for item_id, answer, _, _ in _ANSWERS)
    labels = tuple(
        ItemLabel(item_id, criterion, person, verdicts[index] == "1")
        for item_id, _, *by_person in _ANSWERS
        for person, verdicts in zip(LABELLERS, by_person, strict=True)
        for index, criterion in enumerate(CRITERIA))
    return AnswerSet(name=BUNDLED_NAME, items=items, labels=labels, source="bundled")


DEMO_REWRITES: dict[str, tuple[tuple[str, tuple[str, ...], str], ...]] = {
    CRITERIA[1]: (
        ("reword", ("The answer mentions at least one of sunlight, light, sun, sunshine",),
         "People pass any mention of the light plants use, not only the word 'sunlight'."),
        ("reword", ("The answer mentions either light or the sun",),
         "Shorter: light or the sun is what people accepted."),
        ("reword", ("The answer mentions at least one of sunlight, light, sun, sunshine, "
                    "daylight",),
         "Also accepts 'daylight', on which the two labellers disagree."),
    ),
    CRITERIA[2]: (
        ("split", ("The answer mentions water",
                   "The answer mentions at least one of carbon dioxide, CO2"),
         "People accept 'CO2' for carbon dioxide; checking each ingredient alone says which "
         "is missing."),
        ("reword", ("The answer mentions at least one of carbon dioxide, CO2",),
         "Keeps the gas only, written either way (drops water)."),
    ),
}
"""What the demo refiner proposes for the bundled criteria it knows: (kind, criteria, why)."""
