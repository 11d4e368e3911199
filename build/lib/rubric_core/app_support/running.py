"""Running: form checks, the run spec, recording a run in the store, progress and
next-step advice, resume.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core import recording
from rubric_core.app_support._common import FORM_DEFAULTS, LLM_GRADER_HINT, UiMessage
from rubric_core.app_support.authoring import build_tools, default_tool_names, lint_for_ui
from rubric_core.app_support.settings import build_model, check_max_iterations, model_problem
from rubric_core.examples import list_examples
from rubric_core.redact import redact
from rubric_core.runner import RunSpec

if TYPE_CHECKING:
    from rubric_core.app_support._common import Level
    from rubric_core.runner import RunEvent
    from rubric_core.store import RunRecord, Store


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
    session_key: str | None = field(default=None, repr=False)
    """A key typed into the app for ``base_url`` (memory only: never stored or shown)."""

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
            session_key=text("session_api_key").strip() or None,
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
        reason = model_problem(model, base_url=form.base_url, secrets=secrets,
                               session_key=form.session_key)
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
                           token_delay_s=token_delay_s, session_key=form.session_key),
        grader=build_model(form.grader_model, base_url=form.base_url, secrets=secrets,
                           session_key=form.session_key),
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
    """A short label for the run index (`rubric_core.recording.run_title` of the form)."""
    return recording.run_title(form.prompt, form.example_name)


def start_run(store: Store, form: RunForm) -> RunRecord:
    """Add the run to the index before any token is spent (no credentials are stored)."""
    return store.create_run(
        title=redact(run_title(form)), prompt=redact(form.prompt), rubric=redact(form.rubric),
        worker_model=form.worker_model, grader_model=form.grader_model,
        max_iterations=int(form.max_iterations),
        worker_system_prompt=redact(form.worker_system_prompt),
        grader_system_prompt=redact(form.grader_system_prompt), grader_tools=form.tool_names,
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


def recorded_events(
    store: Store,
    run_id: str,
    events: Iterator[RunEvent],
    *,
    prior_duration_s: float = 0.0,
) -> Iterator[RunEvent]:
    """`rubric_core.recording.record_events`, recorded once per server process.

    When the page is stopped or rerun this generator is closed, which closes the runner and
    marks the run ``interrupted``; its thread stays in the database for a resume.

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
        yield from recording.record_events(store, run_id, events,
                                           prior_duration_s=prior_duration_s)
    finally:
        with _ACTIVE_CHANGED:
            _ACTIVE_RUNS.discard(run_id)
            _ACTIVE_CHANGED.notify_all()


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
    """The form to resume a stored run with: the settings it was started with.

    The run index keeps prompt, rubric, models, cap, system prompts and grader tool names.
    A bundled example's run also takes the example back (its tools carry the example's test
    cases or schema). Runs stored before system prompts and tools were kept take them from
    the current form when it holds the same prompt and rubric, else the defaults with the
    default tools the rubric names.
    """
    form = RunForm(
        prompt=record.prompt, rubric=record.rubric, worker_model=record.worker_model,
        grader_model=record.grader_model, max_iterations=record.max_iterations,
        base_url=current.base_url, session_key=current.session_key,
    )
    for example in list_examples():
        if example.prompt == record.prompt and example.rubric == record.rubric:
            form.example_name = example.name
            form.worker_system_prompt = example.worker_system_prompt
            form.tool_names = [t.name for t in example.grader_tools()]
            break
    if record.grader_tools is not None:  # recorded: the run's own settings win
        form.worker_system_prompt = record.worker_system_prompt or ""
        form.grader_system_prompt = record.grader_system_prompt or ""
        form.tool_names = list(record.grader_tools)
        return form
    if form.example_name:
        return form
    if current.prompt == record.prompt and current.rubric == record.rubric:
        form.example_name = current.example_name
        form.worker_system_prompt = current.worker_system_prompt
        form.grader_system_prompt = current.grader_system_prompt
        form.tool_names = list(current.tool_names)
        return form
    form.tool_names = [name for name in default_tool_names() if name in record.rubric]
    return form
