"""Criterion health: pass rate, κ with people and its interval, stability, people vs people,
and each flag raised exactly where it should be (and not below `MIN_ANSWERS`)."""

from __future__ import annotations

from typing import Any

from rubric_core.lab import GraderConfig, JobView, health_of
from rubric_core.lab.health import MIN_ANSWERS, people_pairs
from rubric_core.lab.results import ItemVerdict, people_verdicts
from rubric_core.store import ItemLabel, RegradeJob

RUBRIC = "- always\n- never\n- agrees\n- wrong\n- twin\n- shaky"


def _view(verdicts: dict[str, dict[str, bool]], labels: list[ItemLabel],
          agreement: dict[str, dict[str, float]] | None = None, repeats: int = 1,
          rubric: str = RUBRIC) -> JobView:
    config = GraderConfig(rubric=rubric, grader_repeats=repeats)
    job = RegradeJob("job", "j", "set", 1, (config,), "finished", "", "")
    items: dict[str, ItemVerdict] = {}
    for item_id, by_criterion in verdicts.items():
        criteria: dict[str, Any] = {name: {"name": name, "passed": ok, **({} if ok else {
            "gap": "x"})} for name, ok in by_criterion.items()}
        items[item_id] = ItemVerdict(item_id, "needs_revision", criteria,
                                     (agreement or {}).get(item_id, dict.fromkeys(criteria, 1.0)),
                                     repeats, 0)
    return JobView(job, [items], people_verdicts(labels), list(verdicts))


def _scenario() -> JobView:
    verdicts, labels, agreement = {}, [], {}
    for i in range(10):
        item = f"i{i}"
        agrees = i % 2 == 0
        verdicts[item] = {"always": True, "never": False, "agrees": agrees,
                          "wrong": i < 5, "twin": agrees, "shaky": i % 3 == 0}
        agreement[item] = {"always": 1.0, "never": 1.0, "agrees": 1.0, "wrong": 1.0,
                           "twin": 1.0, "shaky": 2 / 3 if i < 4 else 1.0}
        labels += [ItemLabel(item, "agrees", "Ana", agrees),
                   ItemLabel(item, "agrees", "Ben", agrees if i else not agrees),
                   ItemLabel(item, "wrong", "Ana", i % 2 == 1)]
    return _view(verdicts, labels, agreement, repeats=3)


def test_flags_are_raised_where_they_belong() -> None:
    report = health_of(_scenario())
    flags = {h.criterion: h.flags for h in report.criteria}
    assert flags == {
        "always": ("never_fails",),
        "never": ("always_fails",),
        "agrees": ("redundant",),  # the same verdicts as "twin" on every answer
        "wrong": ("disagrees",),
        "twin": ("redundant",),
        "shaky": ("unstable",),
    }
    twin = next(h for h in report.criteria if h.criterion == "twin")
    assert twin.redundant_with == "agrees"
    assert [h.criterion for h in report.flagged("disagrees")] == ["wrong"]


def test_agreement_stability_and_the_people_ceiling() -> None:
    report = health_of(_scenario())
    agrees = next(h for h in report.criteria if h.criterion == "agrees")
    # Ana agrees with the grader on all 10, Ben on 9: 19 of 20 pairs.
    assert (agrees.people_n, agrees.agree_pct, agrees.graded, agrees.pass_rate) == (
        20, 95.0, 10, 0.5)
    assert agrees.kappa == 0.9 and agrees.kappa_low is not None and agrees.kappa_high == 1.0
    assert (agrees.people_pairs, agrees.people_kappa) == (10, 0.8)  # Ana vs Ben: 9 of 10
    shaky = next(h for h in report.criteria if h.criterion == "shaky")
    assert shaky.stability == 0.6  # 4 of 10 answers had a dissenting repeat
    wrong = next(h for h in report.criteria if h.criterion == "wrong")
    assert wrong.kappa is not None and wrong.kappa < 0.6 and wrong.people_kappa is None
    table = report.table()
    assert list(table["criterion"]) == ["always", "never", "agrees", "wrong", "twin", "shaky"]
    assert table.loc[4, "flags"] == "redundant (agrees)"


def test_no_flag_below_the_minimum_and_no_stability_without_repeats() -> None:
    few = {f"i{i}": {"always": True, "never": False} for i in range(MIN_ANSWERS - 1)}
    labels = [ItemLabel(i, "always", "Ana", False) for i in few]
    report = health_of(_view(few, labels, rubric="- always\n- never"))
    assert all(h.flags == () for h in report.criteria)
    assert all(h.stability is None for h in report.criteria)


def test_a_reworded_criterion_is_judged_against_the_originals_labels() -> None:
    config = GraderConfig(rubric="- new wording", label_criteria=(("new wording", "Old"),))
    assert config.labelled_as("New wording.") == "old"
    job = RegradeJob("job", "j", "set", 1, (config,), "finished", "", "")
    items = {f"i{i}": ItemVerdict(f"i{i}", "satisfied",
                                  {"new wording": {"name": "new wording", "passed": True}},
                                  {"new wording": 1.0}, 1, 0) for i in range(5)}
    labels = [ItemLabel(f"i{i}", "old", "Ana", True) for i in range(5)]
    [row] = health_of(JobView(job, [items], people_verdicts(labels), list(items))).criteria
    assert (row.people_n, row.agree_pct) == (5, 100.0)


def test_people_pairs_are_every_two_labellers_on_one_answer() -> None:
    pairs = people_pairs({"a": {"Ana": True, "Ben": False, "Cy": True}, "b": {"Ana": True}})
    assert sorted(pairs) == sorted([(True, False), (True, True), (False, True)])
