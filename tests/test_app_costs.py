"""Costs in the app (AppTest): the sidebar's prices, cost on Run, Review and Experiments, and
the estimate and budget shown before an experiment starts.

Model traffic goes to the loopback server that reports cached prompt tokens
(`openai_server.CachingOpenAI`); its ``openai-compatible:`` models have no known price until one
is typed in the sidebar, so "unknown" and an override are both seen.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openai_server import CachingOpenAI, Reply, text, verdict
from streamlit.testing.v1 import AppTest
from test_app import _messages, _texts, goto, navigation_routing, run_loop  # noqa: F401

from rubric_core import app_support as sup
from rubric_core.prices import format_dollars

if TYPE_CHECKING:
    import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = "openai-compatible:llama3.1"
PRICE = f"{MODEL}=1000,100,3000"
PER_M = (Decimal(1000), Decimal(100), Decimal(3000))


def by_hand(calls: list[dict[str, Any]]) -> Decimal:
    fresh, cached, output = PER_M
    return sum(((c["input_tokens"] - c["cached_input_tokens"]) * fresh
                + c["cached_input_tokens"] * cached + c["output_tokens"] * output) / 10**6
               for c in calls)


def tokens(calls: list[dict[str, Any]]) -> str:
    fresh, cached, output = (sum(c[k] for c in calls) for k in (
        "input_tokens", "cached_input_tokens", "output_tokens"))
    return (f"{fresh:,} tokens in ({cached:,} read from the provider's prompt cache), "
            f"{output:,} out")


def respond_factory() -> Any:
    graded: list[int] = []

    def respond(body: dict[str, Any]) -> Reply:
        names = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        if "GraderResponse" not in names:
            return text(f"draft {len(graded) + 1}")
        graded.append(1)
        return verdict("satisfied") if len(graded) % 2 == 0 else verdict("needs_revision", ("c2",))

    return respond


def test_a_price_typed_in_the_sidebar_costs_cached_tokens_on_run_and_review(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    db_path = tmp_path / "app.sqlite3"
    with CachingOpenAI(default=respond_factory()) as server:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        at.session_state["db_path"] = str(db_path)
        at.session_state["prompt"] = "Write a note. " + "Context kept the same. " * 60
        at.session_state["rubric_text"] = "- c1\n- c2"
        at.run()
        at.sidebar.text_input(key="base_url").input(server.base_url).run()
        for role in ("worker_model", "grader_model"):
            at.sidebar.selectbox(key=role).set_value(MODEL).run()
        assert "price unknown" in _texts(at.sidebar.caption)
        store = run_loop(at)
        run_id = at.session_state["last_run_id"]
        calls = store.calls(run_id)
        assert calls[3]["cached_input_tokens"] > 0
        # Without a price: unknown, never $0 (the live figure too, with where to set it).
        assert "Cost: unknown (worker unknown · grader unknown)" in _texts(at.caption)
        assert (f"Cost: unknown (worker unknown · grader unknown) · 4 model calls: "
                f"{tokens(calls)}. A model's price is unknown: set it in the sidebar's Cost."
                in _texts(at.caption)), _texts(at.caption)
        # A price typed now applies to the run already made (costed from recorded tokens).
        at.sidebar.text_area(key=sup.PRICES_KEY).input(PRICE).run()
        assert not at.exception, at.exception
        assert "$1,000.00 in · $100.00 cached · $3,000.00 out" in _texts(at.sidebar.caption)
        total = by_hand(calls)
        worker = by_hand([c for c in calls if c["role"] == "worker"])
        shown = _texts(at.caption)
        assert (f"Cost: {format_dollars(total)} (worker {format_dollars(worker)} · grader "
                f"{format_dollars(total - worker)})") in shown, shown
        passes = next(d.value for d in at.dataframe if "grader" in d.value.columns
                      and "total" in d.value.columns)
        assert list(passes["total"]) == [format_dollars(by_hand(calls[:2])),
                                         format_dollars(by_hand(calls[2:]))]
        # Review: the run list's cost column and the run's cost.
        goto(at, "review")
        history = next(d.value for d in at.dataframe if "run_id" in d.value.columns)
        assert list(history["cost"]) == [format_dollars(total)]
        assert f"Cost: {format_dollars(total)}" in _texts(at.caption)
        # A bad line is named and ignored, not a crash.
        at.sidebar.text_area(key=sup.PRICES_KEY).input(f"{PRICE}\nnonsense").run()
        assert "line 2" in _texts(at.sidebar.warning)
        assert f"Cost: {format_dollars(total)}" in _texts(at.caption)


def test_the_run_page_shows_the_running_cost_at_the_sidebar_prices_as_calls_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # AppTest sees a slot's last drawing only: that each call redraws it is
    # tests/test_costs.py's (a call_finished event per call, the running figure after each).
    monkeypatch.setenv(sup.TOKEN_DELAY_ENV, "0")
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    with CachingOpenAI(default=respond_factory()) as server:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        at.session_state["db_path"] = str(tmp_path / "app.sqlite3")
        at.session_state["prompt"] = "Write a note. " + "Context kept the same. " * 60
        at.session_state["rubric_text"] = "- c1\n- c2"
        at.run()
        at.sidebar.text_input(key="base_url").input(server.base_url).run()
        for role in ("worker_model", "grader_model"):
            at.sidebar.selectbox(key=role).set_value(MODEL).run()
        at.sidebar.text_area(key=sup.PRICES_KEY).input(PRICE).run()
        store = run_loop(at)
        calls = store.calls(at.session_state["last_run_id"])
        assert sum(c["cached_input_tokens"] for c in calls) > 0
        total = by_hand(calls)
        worker = by_hand([c for c in calls if c["role"] == "worker"])
        live = (f"Cost: {format_dollars(total)} (worker {format_dollars(worker)} · "
                f"grader {format_dollars(total - worker)}) · 4 model calls: {tokens(calls)}.")
        assert live in _texts(at.caption), _texts(at.caption)
        # The live figure ends where the result's cost (from the recorded calls) starts.
        assert f"Cost: {format_dollars(total)} (worker" in _texts(at.caption)


def test_the_estimate_is_shown_before_start_and_a_budget_needs_prices(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(tmp_path / "app.sqlite3")
    at.run()
    goto(at, "experiments")
    at.button(key="load_demo_dataset").click().run()
    # demo × rules cost nothing: the estimate says so before Start.
    assert "Estimate: about $0 for 24 cells" in _texts(at.caption), _texts(at.caption)
    at.text_input(key="base_url").input("http://127.0.0.1:9/v1").run()
    for field in ("worker", "grader"):
        at.selectbox(key=sup.config_key(0, field)).set_value(MODEL).run()
    assert "Estimate: about unknown for 24 cells" in _texts(at.caption)
    at.number_input(key="exp_budget").set_value(5.0).run()
    assert "the budget cannot be enforced: no known price for " + MODEL in _texts(at.error)
    assert at.button(key="exp_start").disabled
    at.sidebar.text_area(key=sup.PRICES_KEY).input(PRICE).run()
    # Cap 3 × (2,000 in + 1,000 out worker, 4,000 in + 500 out grader) at the typed price.
    each = 3 * (Decimal(2000 + 4000) * 1000 + Decimal(1000 + 500) * 3000) / 10**6
    assert (f"Estimate: about {format_dollars(24 * each)} for 24 cells; budget $5.00"
            in _texts(at.caption)), _texts(at.caption)
    assert not at.error, _messages(at)
    # Allowing unknown prices instead also lets it start.
    at.sidebar.text_area(key=sup.PRICES_KEY).input("").run()
    at.checkbox(key="exp_allow_unknown").check().run()
    assert not at.error, _messages(at)


def test_an_experiment_summary_and_compare_show_costs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUBRIC_STUDIO_BASE_URL", raising=False)
    db_path = tmp_path / "app.sqlite3"
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state["db_path"] = str(db_path)
    at.run()
    goto(at, "experiments")
    at.button(key="load_demo_dataset").click().run()
    at.number_input(key="exp_config_count").set_value(2).run()
    at.number_input(key=sup.config_key(1, "cap")).set_value(1).run()
    at.button(key="exp_start").click().run()
    assert not at.exception, at.exception
    at.session_state["exp_tab"] = "Summary"
    at.run()
    summary = next(d.value for d in at.dataframe if "cost_usd" in d.value.columns)
    assert list(summary["cost_usd"]) == ["$0", "$0"]  # offline models: known, and free
    assert "Cost: $0, priced from the recorded tokens" in _texts(at.caption)
    at.session_state["exp_tab"] = "Compare"
    at.run()
    sentence = _texts(at.markdown)
    assert "passes 24 fewer rows than" in sentence and "costs the same per 100 rows" in sentence
