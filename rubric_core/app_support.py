"""What the Streamlit pages compute, kept here so it can be unit-tested without Streamlit.

The pages in ``pages/`` only read widgets, call these helpers and draw. Nothing here imports
Streamlit: session state arrives as a plain ``MutableMapping`` and secrets as a ``Mapping``.

Sections, in page order: settings and database (sidebar), authoring (lint, the criteria
table, examples, grader tools), running (form checks, the run spec, recording a run in the
store, progress and next-step advice, resume), and review (tables, heatmap, diff, export).
"""

from __future__ import annotations

import contextlib
import html
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from rubric_core.examples import get_example, list_examples
from rubric_core.export import criteria_changes, heatmap_frame, iteration_diff, to_csv, to_json
from rubric_core.models import BASE_URL_ENV, PROVIDERS, ModelConfigError, resolve_model
from rubric_core.rubric import lint_rubric, parse_criteria
from rubric_core.runner import MAX_ITERATIONS_CAP, RunSpec
from rubric_core.store import RUN_STATUSES, Store, StoreError, default_db_path

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

    from rubric_core.runner import RunEvent
    from rubric_core.store import RunRecord
    from rubric_core.types import RubricEvaluation

Level = Literal["error", "warning", "info", "success"]
"""How loudly a message is shown (the name of the Streamlit call that shows it)."""

TOKEN_DELAY_ENV = "RUBRIC_STUDIO_TOKEN_DELAY"
"""Environment variable: seconds between the demo worker's streamed chunks."""

DEFAULT_TOKEN_DELAY_S = 0.01
"""Delay that makes the offline demo worker's stream visible in the browser."""

MIN_ITERATIONS = 1
"""Lowest iteration cap the sidebar accepts."""

MAX_ITERATIONS = MAX_ITERATIONS_CAP
"""Highest iteration cap the sidebar accepts (the runner's own limit)."""

LLM_GRADER_HINT = "hybrid:openai:gpt-4.1-mini"
"""Grader to suggest when the rules grader cannot check a criterion."""

RESUMABLE_STATUSES: tuple[str, ...] = ("running", "interrupted")
"""Run statuses that the Run page offers to resume (``running``: the server died mid-run)."""

HISTORY_PAGE_SIZE = 50
"""Runs per page of the history table."""

FORM_DEFAULTS: dict[str, Any] = {
    "worker_model": "demo",
    "grader_model": "rules",
    "base_url": "",
    "max_iterations": 3,
    "example_select": "haiku",
    "example_name": None,
    "prompt": "",
    "worker_system_prompt": "",
    "rubric_text": "",
    "grader_tools": [],
    "grader_system_prompt": "",
    "rubric_name": "",
    "filter_status": [],
    "filter_model": "",
    "filter_text": "",
    "history_page": 1,
}
"""Session-state keys shared between pages, with their first values."""


@dataclass(frozen=True)
class UiMessage:
    """A message for the page: what is wrong (or notable) and what to do."""

    level: Level
    """How to show it."""
    text: str
    """The message."""


# --------------------------------------------------------------------------- settings, database


def safe_mapping(source: Any) -> dict[str, Any]:
    """A plain dict copy of a mapping that may fail to load (``st.secrets`` without a file).

    Args:
        source: A mapping, or an object whose iteration raises when it has no content.

    Returns:
        Its items, or an empty dict when reading it raised.
    """
    try:
        return {str(k): source[k] for k in source}
    except Exception:  # st.secrets raises its own error type when no secrets file exists
        return {}


def resolve_db_path(session_value: object, secrets: Mapping[str, Any]) -> Path:
    """The database the app uses: session state (tests), then secrets, then the default.

    Args:
        session_value: ``st.session_state.get("db_path")``.
        secrets: The app's secrets.

    Returns:
        The path to open.
    """
    for value in (session_value, secrets.get("db_path")):
        if isinstance(value, str | Path) and str(value).strip():
            return Path(str(value).strip()).expanduser()
    return default_db_path()


def store_error_message(error: str) -> str:
    """The page text for a database that cannot be used."""
    return (
        f"The database cannot be used, so runs cannot be started, stored or reviewed. {error} "
        "Authoring still works; nothing was deleted or overwritten."
    )


def token_delay(env_value: str | None, override: object = None) -> float:
    """Seconds between the demo worker's chunks.

    Args:
        env_value: ``$RUBRIC_STUDIO_TOKEN_DELAY``.
        override: ``st.session_state["token_delay_s"]`` (tests set 0).

    Returns:
        The override, else the environment value, else :data:`DEFAULT_TOKEN_DELAY_S`.
    """
    for value in (override, env_value):
        if value is None or isinstance(value, bool) or value == "":
            continue
        try:
            delay = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if delay >= 0:
            return delay
    return DEFAULT_TOKEN_DELAY_S


def check_max_iterations(value: object) -> tuple[int, str | None]:
    """Bring a max-iterations value into range.

    Returns:
        The value to use, and a message saying what was wrong (None when it was fine).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        return FORM_DEFAULTS["max_iterations"], (
            f"Max iterations {value!r} is not a whole number; it was reset to "
            f"{FORM_DEFAULTS['max_iterations']}. Choose a value from {MIN_ITERATIONS} to "
            f"{MAX_ITERATIONS}."
        )
    number = int(value)
    if MIN_ITERATIONS <= number <= MAX_ITERATIONS:
        return number, None
    clamped = min(max(number, MIN_ITERATIONS), MAX_ITERATIONS)
    return clamped, (
        f"Max iterations {number} is outside {MIN_ITERATIONS}–{MAX_ITERATIONS}; it was set to "
        f"{clamped}. Choose a value in that range."
    )


@dataclass(frozen=True)
class ModelChoice:
    """One entry of a model selectbox."""

    value: str
    """The model string passed to the runner."""
    reason: str | None = None
    """Why it cannot be used right now; None when it can."""

    @property
    def label(self) -> str:
        """What the selectbox shows."""
        return self.value if self.reason is None else f"{self.value} — unavailable: {self.reason}"


_OFFLINE_LABELS = {"demo": "demo (offline demo worker)", "rules": "rules (offline rules grader)"}


def model_label(choices: Sequence[ModelChoice], value: str) -> str:
    """The label for ``value`` among ``choices`` (the value itself when not listed)."""
    for choice in choices:
        if choice.value == value:
            if choice.reason is None:
                return _OFFLINE_LABELS.get(value, value)
            return choice.label
    return value


def provider_env(env: Mapping[str, str], secrets: Mapping[str, Any]) -> dict[str, str]:
    """The environment with API keys from secrets added (secrets win)."""
    merged = dict(env)
    merged.update({k: v for k, v in secrets.items() if isinstance(v, str) and k.endswith("_KEY")})
    return merged


def model_options(
    role: Literal["worker", "grader"],
    *,
    env: Mapping[str, str],
    secrets: Mapping[str, Any],
    base_url: str | None = None,
    current: str | None = None,
) -> list[ModelChoice]:
    """The models a sidebar selectbox offers; unavailable ones carry the reason.

    Args:
        role: ``worker`` lists ``demo`` first, ``grader`` lists ``rules`` and a hybrid grader.
        env: The process environment.
        secrets: The app's secrets (API keys there count as set).
        base_url: The OpenAI-compatible base URL typed in the sidebar.
        current: The selected value; added when it is not a listed one.

    Returns:
        The choices, offline models first.
    """
    merged = provider_env(env, secrets)
    choices = [ModelChoice("demo" if role == "worker" else "rules")]
    base = (base_url or merged.get(BASE_URL_ENV) or "").strip()
    compat_reason = None if base else (
        f"set an OpenAI-compatible base URL in the sidebar or {BASE_URL_ENV}"
    )
    openai = next(p for p in PROVIDERS if p.name == "openai")
    if compat_reason is None and not openai.installed():
        compat_reason = openai.unavailable_reason({"OPENAI_API_KEY": "x"})
    choices.append(ModelChoice("openai-compatible:llama3.1", compat_reason))
    for provider in PROVIDERS:
        reason = provider.unavailable_reason(merged)
        if provider.name == "openai" and base and provider.installed():
            reason = None  # a local server needs no key
        choices.append(ModelChoice(provider.example, reason))
        if role == "grader":
            choices.append(ModelChoice(f"hybrid:{provider.example}", reason))
    if current and current not in {c.value for c in choices}:
        choices.append(ModelChoice(current))
    return choices


def api_key_for(model: str, secrets: Mapping[str, Any]) -> str | None:
    """The API key for a model string from secrets, or None (the environment is used then)."""
    spec = model.removeprefix("hybrid:")
    provider = spec.partition(":")[0]
    if provider == "openai-compatible":
        provider = "openai"
    for p in PROVIDERS:
        if p.name == provider and p.key_env:
            value = secrets.get(p.key_env)
            return value if isinstance(value, str) and value else None
    return None


def build_model(
    model: str, *, base_url: str | None, secrets: Mapping[str, Any], token_delay_s: float = 0.0
) -> BaseChatModel:
    """Resolve a model string with its own key from secrets (never stored).

    Raises:
        ModelConfigError: Unknown provider, missing package or key, malformed string.
    """
    return resolve_model(
        model, base_url=base_url or None, api_key=api_key_for(model, secrets),
        token_delay_s=token_delay_s,
    )


def model_problem(model: str, *, base_url: str | None, secrets: Mapping[str, Any]) -> str | None:
    """Why a model string cannot be used (the ``ModelConfigError`` message), or None."""
    try:
        build_model(model, base_url=base_url, secrets=secrets)
    except ModelConfigError as exc:
        return str(exc)
    return None


# --------------------------------------------------------------------------- authoring


def example_choices() -> dict[str, str]:
    """Bundled examples for the selectbox: name → title."""
    return {e.name: e.title for e in list_examples()}


def load_example_into(state: MutableMapping[str, Any], name: str | None = None) -> None:
    """Fill the authoring form from a bundled example (a button callback).

    Args:
        state: Session state.
        name: The example; ``state["example_select"]`` when None.
    """
    example = get_example(name or state["example_select"])
    state["example_name"] = example.name
    state["prompt"] = example.prompt
    state["worker_system_prompt"] = example.worker_system_prompt
    state["rubric_text"] = example.rubric
    state["rubric_name"] = example.name
    state["grader_tools"] = [t.name for t in example.grader_tools()]
    state["max_iterations"] = example.max_iterations
    state["grader_system_prompt"] = ""


def default_tool_names() -> list[str]:
    """Names of the general evidence tools any rubric may use."""
    from rubric_core.tools import DEFAULT_TOOLS

    return list(DEFAULT_TOOLS)


def tool_options(example_name: str | None, selected: Iterable[str] = ()) -> list[str]:
    """Grader tools to offer: the default tools, the loaded example's, and any selected."""
    names = default_tool_names()
    if example_name:
        with contextlib.suppress(KeyError):
            names += [t.name for t in get_example(example_name).grader_tools()]
    names += list(selected)
    return list(dict.fromkeys(names))


def build_tools(names: Iterable[str], example_name: str | None = None) -> list[BaseTool]:
    """Fresh tool instances for the grader, by name.

    Raises:
        ValueError: A name is neither a default tool nor one of the example's.
    """
    from rubric_core.tools import DEFAULT_TOOLS

    available: dict[str, BaseTool] = dict(DEFAULT_TOOLS)
    if example_name:
        with contextlib.suppress(KeyError):
            available.update({t.name: t for t in get_example(example_name).grader_tools()})
    tools: list[BaseTool] = []
    for name in dict.fromkeys(names):
        if name not in available:
            msg = (
                f"Grader tool {name!r} is not available: load the example that provides it "
                "or remove it from the grader tools."
            )
            raise ValueError(msg)
        tools.append(available[name])
    return tools


def criteria_to_text(criteria: Iterable[str]) -> str:
    """Rubric text with one bullet per criterion (blank entries dropped)."""
    return "\n".join(f"- {c.strip()}" for c in criteria if c and c.strip())


def criteria_frame(rubric: str) -> pd.DataFrame:
    """The parsed criteria as an editable table (one ``criterion`` column)."""
    return pd.DataFrame({"criterion": pd.Series(parse_criteria(rubric), dtype=object)})


def apply_editor_edits(criteria: Sequence[str], edits: Mapping[str, Any]) -> list[str]:
    """Apply ``st.data_editor`` edits (edited, added, deleted rows) to a criteria list.

    Args:
        criteria: The criteria the editor was given, in row order.
        edits: The editor's state: ``edited_rows``, ``added_rows``, ``deleted_rows``.

    Returns:
        The new criteria, blank rows dropped.
    """
    rows = list(criteria)
    for index, change in (edits.get("edited_rows") or {}).items():
        i = int(index)
        if 0 <= i < len(rows) and "criterion" in change:
            rows[i] = str(change["criterion"] or "")
    deleted = {int(i) for i in edits.get("deleted_rows") or []}
    rows = [c for i, c in enumerate(rows) if i not in deleted]
    rows += [str(r.get("criterion") or "") for r in edits.get("added_rows") or []]
    return [" ".join(c.split()) for c in rows if c and c.strip()]


def editor_key(rubric: str) -> str:
    """A data-editor key tied to the rubric text, so the table resets when the text changes."""
    import hashlib

    return "criteria_editor_" + hashlib.sha1(rubric.encode()).hexdigest()[:12]


def sync_rubric_from_editor(state: MutableMapping[str, Any], key: str, rubric: str) -> None:
    """Data-editor callback: rewrite the rubric text from the edited table."""
    edits = state.get(key) or {}
    state["rubric_text"] = criteria_to_text(apply_editor_edits(parse_criteria(rubric), edits))


def lint_for_ui(
    rubric: str, grader_model: str, tool_names: Iterable[str] = ()
) -> list[UiMessage]:
    """Everything worth saying about a rubric before any token is spent.

    Args:
        rubric: The rubric text.
        grader_model: The selected grader; criteria the rules grader cannot check are
            reported when it is ``rules``.
        tool_names: Grader tools that will be bound (some criteria name them).

    Returns:
        Errors (the run is blocked) first, then warnings.
    """
    if not rubric.strip():
        return [UiMessage("error", "The rubric is empty: write at least one criterion, one per "
                                   "line (or load a bundled example).")]
    out: list[UiMessage] = []
    for issue in lint_rubric(rubric):
        text = issue.message if issue.criterion is None or issue.criterion in issue.message else (
            f"{issue.message} — “{issue.criterion}”"
        )
        out.append(UiMessage(issue.level, text))
    if grader_model.strip() == "rules":
        from rubric_core.offline.rules import unrecognised_criteria

        unknown = unrecognised_criteria(parse_criteria(rubric), tool_names=tuple(tool_names))
        if unknown:
            listed = "; ".join(f"“{c}”" for c in unknown)
            out.append(UiMessage(
                "warning",
                f"The rules grader cannot check {len(unknown)} criterion(s): {listed}. A run "
                "would end 'failed'. Choose an LLM grader in the sidebar (for example "
                f"{LLM_GRADER_HINT!r}), rephrase them as countable checks (lines, words, "
                "syllables, mentions, valid JSON, tests in a tool), or add the tool they name.",
            ))
    return sorted(out, key=lambda m: m.level != "error")


# --------------------------------------------------------------------------- running


@dataclass
class RunForm:
    """Everything the Run page needs from the authoring form and the sidebar."""

    prompt: str = ""
    rubric: str = ""
    worker_model: str = "demo"
    grader_model: str = "rules"
    max_iterations: Any = 3
    worker_system_prompt: str = ""
    grader_system_prompt: str = ""
    tool_names: list[str] = field(default_factory=list)
    example_name: str | None = None
    base_url: str = ""

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RunForm:
        """Read the form from session state (missing keys take their defaults)."""

        def text(key: str) -> str:
            value = state.get(key, FORM_DEFAULTS.get(key))
            return value if isinstance(value, str) else ""

        return cls(
            prompt=text("prompt"), rubric=text("rubric_text"),
            worker_model=text("worker_model").strip() or "demo",
            grader_model=text("grader_model").strip() or "rules",
            max_iterations=state.get("max_iterations", FORM_DEFAULTS["max_iterations"]),
            worker_system_prompt=text("worker_system_prompt"),
            grader_system_prompt=text("grader_system_prompt"),
            tool_names=list(state.get("grader_tools") or []),
            example_name=state.get("example_name") or None,
            base_url=text("base_url").strip(),
        )


def check_form(form: RunForm, *, secrets: Mapping[str, Any]) -> list[UiMessage]:
    """What stops the run (errors) or deserves a look first (warnings); nothing is called.

    Returns:
        Messages, errors first.
    """
    out: list[UiMessage] = []
    if not form.prompt.strip():
        out.append(UiMessage("error", "The prompt is empty: on the Author page, say what the "
                                      "worker should do (or load a bundled example)."))
    out += lint_for_ui(form.rubric, form.grader_model, form.tool_names)
    _, problem = check_max_iterations(form.max_iterations)
    if problem:
        out.append(UiMessage("error", problem))
    for role, model in (("Worker", form.worker_model), ("Grader", form.grader_model)):
        reason = model_problem(model, base_url=form.base_url, secrets=secrets)
        if reason:
            out.append(UiMessage("error", f"{role} model: {reason} Choose another model in the "
                                          "sidebar."))
    try:
        build_tools(form.tool_names, form.example_name)
    except ValueError as exc:
        out.append(UiMessage("error", str(exc)))
    return sorted(out, key=lambda m: m.level != "error")


def build_run_spec(form: RunForm, *, secrets: Mapping[str, Any], token_delay_s: float) -> RunSpec:
    """The runner's spec from the form, models resolved with their keys from secrets.

    Raises:
        ModelConfigError: A model cannot be resolved.
        ValueError: A grader tool is unknown or the spec is invalid.
    """
    spec = RunSpec(
        prompt=form.prompt,
        rubric=form.rubric,
        worker=build_model(form.worker_model, base_url=form.base_url, secrets=secrets,
                           token_delay_s=token_delay_s),
        grader=build_model(form.grader_model, base_url=form.base_url, secrets=secrets),
        worker_system_prompt=form.worker_system_prompt.strip() or None,
        grader_system_prompt=form.grader_system_prompt.strip() or None,
        grader_tools=build_tools(form.tool_names, form.example_name),
        max_iterations=int(form.max_iterations),
        base_url=form.base_url or None,
        token_delay_s=token_delay_s,
    )
    spec.validate()
    return spec


def run_title(form: RunForm) -> str:
    """A short label for the run index: the example's title, else the prompt's start."""
    if form.example_name:
        try:
            return get_example(form.example_name).title
        except KeyError:
            pass
    first = " ".join(form.prompt.split())
    return first if len(first) <= 60 else first[:59] + "…"


def start_run(store: Store, form: RunForm) -> RunRecord:
    """Add the run to the index before any token is spent (no credentials are stored)."""
    return store.create_run(
        title=run_title(form), prompt=form.prompt, rubric=form.rubric,
        worker_model=form.worker_model, grader_model=form.grader_model,
        max_iterations=int(form.max_iterations),
    )


_ACTIVE_RUNS: set[str] = set()
_ACTIVE_CHANGED = threading.Condition()
# Streamlit starts a rerun on a new thread while the stopped one still unwinds (fast reruns),
# so the page asks here whether a run is still being recorded by this server process.


def is_active(run_id: str) -> bool:
    """Whether this server process is recording the run right now (running or stopping)."""
    with _ACTIVE_CHANGED:
        return run_id in _ACTIVE_RUNS


def wait_until_inactive(run_id: str, timeout_s: float) -> bool:
    """Wait for a stopping run to finish unwinding; True when it is no longer active."""
    with _ACTIVE_CHANGED:
        return _ACTIVE_CHANGED.wait_for(lambda: run_id not in _ACTIVE_RUNS, timeout=timeout_s)


def _eval_key(ev: Mapping[str, Any]) -> tuple[str, int]:
    return str(ev.get("grading_run_id")), int(ev.get("iteration") or 0)


def recorded_events(
    store: Store,
    run_id: str,
    events: Iterator[RunEvent],
    *,
    prior_duration_s: float = 0.0,
) -> Iterator[RunEvent]:
    """Pass the runner's events through, recording the run in the store as they arrive.

    Each evaluation is added when it finishes (once, even when a resumed node repeats it);
    ``run_finished`` sets the final status. When the events stop early — the page was stopped
    or rerun and this generator closed — the runner is closed too (aborting the graph) and the
    run is marked ``interrupted``; its thread stays in the database for a resume.

    Args:
        store: The database.
        run_id: The run's id in the index.
        events: ``run_rubric(...)``.
        prior_duration_s: Seconds the run already took before a resume.

    Yields:
        The runner's events, unchanged.

    Raises:
        RuntimeError: This server process is already recording the run (a second Resume
            while the first is running or still stopping).
    """
    with _ACTIVE_CHANGED:
        if run_id in _ACTIVE_RUNS:
            msg = (f"Run {run_id[:8]} is already running or stopping in this server; wait a "
                   "moment and try again.")
            raise RuntimeError(msg)
        _ACTIVE_RUNS.add(run_id)
    try:
        yield from _recorded(store, run_id, events, prior_duration_s)
    finally:
        with _ACTIVE_CHANGED:
            _ACTIVE_RUNS.discard(run_id)
            _ACTIVE_CHANGED.notify_all()


def _recorded(
    store: Store, run_id: str, events: Iterator[RunEvent], prior_duration_s: float
) -> Iterator[RunEvent]:
    seen = {_eval_key(e) for e in store.evaluations(run_id)}
    started = time.perf_counter()
    finished = False

    def add(evaluation: RubricEvaluation) -> None:
        key = _eval_key(evaluation)
        if key not in seen:
            store.add_evaluation(run_id, evaluation)
            seen.add(key)

    try:
        for event in events:
            if event["type"] == "evaluation_finished":
                add(event["evaluation"])
            elif event["type"] == "run_finished":
                for evaluation in event["evaluations"]:
                    add(evaluation)
                store.finish_run(
                    run_id, event["status"], error=event["error"],
                    duration_s=round(prior_duration_s + event["duration_s"], 3),
                )
                finished = True
            yield event
    except Exception as exc:
        if not finished:
            finished = True
            _finish_quietly(store, run_id, "error", f"{type(exc).__name__}: {exc}",
                            prior_duration_s + time.perf_counter() - started)
        raise
    finally:
        if not finished:
            close = getattr(events, "close", None)
            if close is not None:
                close()
            _finish_quietly(store, run_id, "interrupted", None,
                            prior_duration_s + time.perf_counter() - started)


def _finish_quietly(
    store: Store, run_id: str, status: str, error: str | None, duration_s: float
) -> None:
    # On failure the record stays 'running', which the Run page still offers to resume.
    with contextlib.suppress(StoreError, KeyError):
        store.finish_run(run_id, status, error=error, duration_s=round(duration_s, 3))


def progress(iteration: int, cap: int) -> tuple[float, str]:
    """Progress bar value and text for the 0-based grader pass ``iteration``."""
    cap = max(cap, 1)
    k = min(iteration + 1, cap)
    return min(k / cap, 1.0), f"Iteration {k} of {cap}"


def answer_markdown(text: str) -> str:
    """Markdown that keeps the answer's line breaks (a haiku stays three lines)."""
    out: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(line)
        else:
            out.append(line if fenced or not line.strip() else line + "  ")
    return "\n".join(out)


def pass_headline(evaluation: Mapping[str, Any]) -> str:
    """One line for a finished grader pass: number, verdict, criteria passed."""
    criteria = evaluation.get("criteria") or []
    passed = sum(1 for c in criteria if c.get("passed"))
    icon = {
        "satisfied": ":material/check_circle:", "needs_revision": ":material/autorenew:",
        "failed": ":material/block:", "grader_error": ":material/error:",
    }.get(str(evaluation.get("result")), ":material/radio_button_unchecked:")
    counts = f" — {passed}/{len(criteria)} criteria pass" if criteria else ""
    number = int(evaluation.get("iteration", 0)) + 1
    return f"{icon} Pass {number}: **{evaluation.get('result')}**{counts}"


def verdict_frame(evaluation: Mapping[str, Any]) -> pd.DataFrame:
    """Per-criterion pass/fail table of one pass, with the gaps."""
    rows = [
        {"criterion": c.get("name", ""), "passed": bool(c.get("passed")),
         "gap": "" if c.get("passed") else c.get("gap", "")}
        for c in evaluation.get("criteria") or []
    ]
    return pd.DataFrame(rows, columns=["criterion", "passed", "gap"])


@dataclass(frozen=True)
class Advice:
    """How the Run page presents a final status."""

    level: Level
    """How to show it."""
    headline: str
    """The status in words."""
    steps: tuple[str, ...] = ()
    """What to do next."""


def next_steps(status: str, *, error: str | None = None, grader_model: str = "") -> Advice:
    """The final status in words, and what to do next for anything but ``satisfied``."""
    rules = grader_model.strip() == "rules"
    review = "Open the Review page to compare the iterations and see each criterion's gap."
    match status:
        case "satisfied":
            return Advice("success", "Final status: satisfied — every criterion passes.",
                          ("Review the iterations or export them from the Review page.",))
        case "failed":
            steps = ["Read the grader's explanation below: it says which criteria it could not "
                     "judge."]
            if rules:
                steps.append(f"Choose an LLM grader in the sidebar (e.g. {LLM_GRADER_HINT!r}), "
                             "or rephrase the criteria the rules grader cannot check.")
            else:
                steps.append("Reword the criteria so each can be judged from the answer alone.")
            return Advice("error", "Final status: failed — the grader could not judge the "
                                   "rubric against this answer.", tuple(steps))
        case "grader_error":
            return Advice("error", "Final status: grader_error — the grader call failed.", (
                "Read the error below: a missing or wrong API key, an unreachable base URL or "
                "a model that returned no usable verdict.",
                "Check the grader model and base URL in the sidebar (is the local server "
                "running?), then start the run again.",
            ))
        case "max_iterations_reached":
            return Advice("warning", "Final status: max_iterations_reached — some criteria "
                                     "still fail after the last allowed pass.", (
                review, "Raise Max iterations in the sidebar, make failing criteria more "
                        "concrete, or choose a stronger worker model.",
            ))
        case "interrupted":
            return Advice("warning", "Final status: interrupted — the run was stopped before "
                                     "it finished.", (
                "Its thread is saved: press Resume below to continue the same grading run.",
            ))
        case "error":
            detail = f" ({error})" if error else ""
            return Advice("error", f"Final status: error — the run stopped on an error{detail}.", (
                "Check the worker model, its API key and the base URL in the sidebar (is the "
                "server reachable from this machine?).",
                "Once fixed, press Resume below to continue the saved thread, or start again.",
            ))
        case _:
            return Advice("info", f"Status: {status} — the run has not finished.", (
                "If the server stopped during the run, press Resume below to continue it.",
            ))


def resume_form(record: RunRecord, current: RunForm) -> RunForm:
    """The form to resume a stored run with.

    The run index keeps prompt, rubric, models and cap; system prompts and grader tools are
    taken from the bundled example with the same prompt and rubric, else from the current
    form when it holds the same prompt and rubric, else left at their defaults with the
    default tools the rubric names.
    """
    form = RunForm(
        prompt=record.prompt, rubric=record.rubric, worker_model=record.worker_model,
        grader_model=record.grader_model, max_iterations=record.max_iterations,
        base_url=current.base_url,
    )
    for example in list_examples():
        if example.prompt == record.prompt and example.rubric == record.rubric:
            form.example_name = example.name
            form.worker_system_prompt = example.worker_system_prompt
            form.tool_names = [t.name for t in example.grader_tools()]
            return form
    if current.prompt == record.prompt and current.rubric == record.rubric:
        form.example_name = current.example_name
        form.worker_system_prompt = current.worker_system_prompt
        form.grader_system_prompt = current.grader_system_prompt
        form.tool_names = list(current.tool_names)
        return form
    form.tool_names = [name for name in default_tool_names() if name in record.rubric]
    return form


# --------------------------------------------------------------------------- review


@dataclass(frozen=True)
class RunFilters:
    """The Review page's filters, as ``Store.list_runs`` takes them."""

    statuses: tuple[str, ...] = ()
    """Keep these statuses (all when empty)."""
    model: str = ""
    """Keep runs whose worker or grader is exactly this."""
    text: str = ""
    """Keep runs whose title, prompt or rubric contains this."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``list_runs`` / ``count_runs``."""
        statuses = [s for s in self.statuses if s in RUN_STATUSES]
        return {
            "status": statuses or None,
            "model": self.model.strip() or None,
            "text": self.text.strip() or None,
        }


def page_count(total: int, page_size: int = HISTORY_PAGE_SIZE) -> int:
    """Pages needed for ``total`` runs (at least one)."""
    return max(1, -(-total // page_size))


def history_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    """The run index as a table for the history listing."""
    rows = [
        {
            "created": r.created_at[:19].replace("T", " "), "title": r.title, "status": r.status,
            "worker": r.worker_model, "grader": r.grader_model, "iterations": r.iterations,
            "duration_s": r.duration_s, "run_id": r.run_id,
        }
        for r in runs
    ]
    return pd.DataFrame(rows, columns=["created", "title", "status", "worker", "grader",
                                       "iterations", "duration_s", "run_id"])


def run_label(record: RunRecord) -> str:
    """One line naming a run in a selectbox."""
    title = record.title or "(untitled)"
    return f"{record.created_at[:16].replace('T', ' ')} · {title} · {record.status} · " + (
        record.run_id[:8]
    )


def iteration_table(evaluations: Iterable[RubricEvaluation]) -> pd.DataFrame:
    """One row per iteration × criterion: the Review page's iteration table."""
    rows: list[dict[str, Any]] = []
    for ev in evaluations:
        tokens = None
        if ev.get("input_tokens") is not None or ev.get("output_tokens") is not None:
            tokens = (ev.get("input_tokens") or 0) + (ev.get("output_tokens") or 0)
        base = {"verdict": ev.get("result"), "explanation": ev.get("explanation", ""),
                "duration_s": ev.get("duration_s"), "tokens": tokens}
        criteria: list[Mapping[str, Any]] = list(ev.get("criteria") or []) or [{}]
        for c in criteria:
            passed = c.get("passed")
            rows.append({
                "iteration": int(ev.get("iteration", 0)) + 1, "criterion": c.get("name", ""),
                "passed": passed, "gap": "" if passed else c.get("gap", ""), **base,
            })
    frame = pd.DataFrame(rows, columns=["iteration", "criterion", "passed", "gap", "verdict",
                                        "explanation", "duration_s", "tokens"])
    return frame.astype({"iteration": "int64", "passed": "boolean", "tokens": "Int64"})


def heatmap_table(evaluations: Iterable[RubricEvaluation], rubric: str | None) -> pd.DataFrame:
    """Criteria × iteration (1-based columns) with ``pass``/``fail``/``—`` cells."""
    frame = heatmap_frame(evaluations, rubric=rubric)
    frame.columns = pd.Index([f"iteration {int(c) + 1}" for c in frame.columns])
    return frame.apply(lambda col: col.map(
        lambda v: "pass" if v is True else "fail" if v is False else "—"
    ))


HEATMAP_COLORS = {"pass": "background-color: #d3f9d8; color: #2b8a3e",
                  "fail": "background-color: #ffe3e3; color: #c92a2a",
                  "—": "color: #868e96"}
"""CSS per heatmap cell value (for ``DataFrame.style.map``)."""


def heatmap_css(value: object) -> str:
    """CSS for one heatmap cell."""
    return HEATMAP_COLORS.get(str(value), "")


def iteration_answers(evaluations: Iterable[RubricEvaluation]) -> dict[int, str]:
    """The graded answer of each iteration (1-based), last grading run wins per iteration."""
    return {int(ev.get("iteration", 0)) + 1: ev.get("answer", "") for ev in evaluations}


def evaluation_at(evaluations: Sequence[RubricEvaluation], iteration: int) -> RubricEvaluation:
    """The evaluation of 1-based ``iteration`` (the last one recorded for it)."""
    for ev in reversed(evaluations):
        if int(ev.get("iteration", 0)) + 1 == iteration:
            return ev
    msg = f"no evaluation for iteration {iteration}"
    raise KeyError(msg)


def diff_html(before: str, after: str) -> str:
    """The word-level diff of two answers as HTML (text escaped; ``<ins>``/``<del>`` spans)."""
    parts: list[str] = []
    for op, text in iteration_diff(before, after):
        escaped = html.escape(text)
        if op == "insert":
            parts.append(f'<ins style="background:#d3f9d8;text-decoration:none">{escaped}</ins>')
        elif op == "delete":
            parts.append(f'<del style="background:#ffe3e3">{escaped}</del>')
        else:
            parts.append(escaped)
    body = "".join(parts)
    return f'<div style="white-space:pre-wrap;line-height:1.5">{body}</div>'


def changes_summary(before: RubricEvaluation, after: RubricEvaluation) -> list[UiMessage]:
    """Criteria fixed and regressed between two evaluations, as page messages."""
    changes = criteria_changes(before, after)
    out: list[UiMessage] = []
    if changes["fixed"]:
        out.append(UiMessage("success", "Fixed: " + "; ".join(changes["fixed"])))
    if changes["regressed"]:
        out.append(UiMessage("error", "Regressed: " + "; ".join(changes["regressed"])))
    if changes["still_failing"]:
        out.append(UiMessage("warning", "Still failing: " + "; ".join(changes["still_failing"])))
    if not out:
        out.append(UiMessage("info", "No criterion changed between these two."))
    return out


def export_bytes(frame: pd.DataFrame) -> tuple[bytes, bytes]:
    """CSV (formula-safe, UTF-8) and JSON bytes of an export frame."""
    return to_csv(frame).encode("utf-8"), to_json(frame).encode("utf-8")


def filtered_pairs(
    store: Store, filters: RunFilters
) -> list[tuple[RunRecord, list[RubricEvaluation]]]:
    """Every run matching the filters with its evaluations (for export), oldest first."""
    runs = store.list_runs(limit=None, **filters.kwargs())[::-1]
    by_run = store.evaluations_for_runs(r.run_id for r in runs)
    return [(r, by_run[r.run_id]) for r in runs]


def base_url_default(env: Mapping[str, str], secrets: Mapping[str, Any]) -> str:
    """The base URL to start with: secrets' ``base_url``, else ``$RUBRIC_STUDIO_BASE_URL``."""
    value = secrets.get("base_url") or env.get(BASE_URL_ENV) or ""
    return str(value).strip()


def env_token_delay() -> str | None:
    """``$RUBRIC_STUDIO_TOKEN_DELAY`` (for :func:`token_delay`)."""
    return os.environ.get(TOKEN_DELAY_ENV)


def load_library_rubric(state: MutableMapping[str, Any], store: Store) -> None:
    """Button callback: put the chosen saved rubric version into the form.

    Reads ``library_select`` and ``library_version`` from ``state``; leaves a message in
    ``state["author_notice"]``.
    """
    name = state.get("library_select")
    version = state.get("library_version")
    if not name:
        state["author_notice"] = UiMessage("warning", "Choose a saved rubric to load first.")
        return
    try:
        text = store.load_rubric(name, version if isinstance(version, int) else None)
    except (KeyError, StoreError) as exc:
        state["author_notice"] = UiMessage("error", f"Could not load the rubric: {exc}")
        return
    state["rubric_text"] = text
    state["rubric_name"] = name
    label = f"version {version}" if isinstance(version, int) else "latest version"
    state["author_notice"] = UiMessage("success", f"Loaded “{name}” ({label}).")


def save_library_rubric(store: Store, name: str, text: str) -> UiMessage:
    """Save the rubric text under a name as a new version; the outcome as a page message."""
    try:
        version = store.save_rubric(name, text)
    except (ValueError, StoreError) as exc:
        return UiMessage("error", f"Not saved: {exc}")
    return UiMessage("success", f"Saved “{name.strip()}” as version {version}.")
