"""Running: the form as `RunSettings`, form checks, the app's models, progress and advice.

Starting, resuming and recording a run is `rubric_core.session`'s; this module turns the
page's widgets into settings and the run's events and status into what the page draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import (
    FORM_DEFAULTS,
    LLM_GRADER_HINT,
    UiMessage,
    criterion_note,
    pass_notes,
)
from rubric_core.app_support.authoring import lint_for_ui
from rubric_core.app_support.settings import (
    check_judging,
    check_max_iterations,
    judging_from_widgets,
    max_tokens_from_widgets,
    model_key,
    model_problem,
    same_url,
)
from rubric_core.export import criterion_rows
from rubric_core.models import model_resolver
from rubric_core.redact import redact, redact_stream
from rubric_core.session import build_grader_tools, resumed_settings
from rubric_core.settings import RunSettings

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from langchain_core.language_models import BaseChatModel

    from rubric_core.app_support._common import Level
    from rubric_core.http_retry import SharedBackoff
    from rubric_core.store import RunRecord
    from rubric_core.types import ModelResolver, Role


def settings_from_state(state: Mapping[str, Any]) -> RunSettings:
    """The authoring form and the sidebar as run settings (missing keys take their defaults).

    The iteration cap is taken as the sidebar holds it; `check_form` reports a bad one.
    """

    def text(key: str) -> str:
        value = state.get(key, FORM_DEFAULTS.get(key))
        return value if isinstance(value, str) else ""

    tools = state.get("grader_tools") or []
    return RunSettings(
        prompt=text("prompt"), rubric=text("rubric_text"),
        worker_model=text("worker_model").strip() or "demo",
        grader_model=text("grader_model").strip() or "rules",
        max_iterations=state.get("max_iterations", FORM_DEFAULTS["max_iterations"]),
        worker_system_prompt=text("worker_system_prompt"),
        grader_system_prompt=text("grader_system_prompt"),
        grader_tools=tuple(str(t) for t in tools),
        example_name=state.get("example_name") or None,
        base_url=text("base_url").strip() or None,
        **judging_from_widgets(*(state.get(k, FORM_DEFAULTS[k])
                                 for k in ("grader_repeats", "consensus", "return_best"))),
        **max_tokens_from_widgets(state.get("worker_max_tokens"),
                                  state.get("grader_max_tokens")),
    )


def session_key(state: Mapping[str, Any]) -> str | None:
    """The key typed in the sidebar for its base URL (memory only: never stored or shown)."""
    value = state.get("session_api_key")
    return value.strip() or None if isinstance(value, str) else None


def app_models(
    secrets: Mapping[str, Any],
    *,
    session_key: str | None,
    sidebar_base_url: str | None,
    token_delay_s: float,
    backoff: SharedBackoff | None = None,
    grader_pause_s: float = 0.0,
) -> ModelResolver:
    """The app's model builder for `rubric_core.session.start`/`resume` and experiments.

    Built by `rubric_core.models.model_resolver` with the app's key rule (`model_key`): a key
    from the environment or secrets goes only to the endpoint it was configured for
    (`base_url_trusted`). The session key was typed for the sidebar's base URL, so it goes to a
    run's base URL only when that is the same server.

    Args:
        secrets: The app's secrets.
        session_key: The key typed in the sidebar (`session_key`).
        sidebar_base_url: The base URL typed in the sidebar.
        token_delay_s: Seconds between the demo worker's chunks.
        grader_pause_s: Seconds the ``rules`` grader takes over each verdict (the paced demo,
            `rubric_core.app_support.settings.demo_pacing`).
        backoff: For an experiment's cells: its shared backoff. The models are then built as
            the CLI's are (`rubric_core.experiments.experiment_models`): OpenAI-compatible
            models send through both of its HTTP clients (so a 429 or 5xx slows the whole
            experiment down), nothing streams (nobody watches a cell), and a model string
            gets one model for the experiment (so its cells share one compiled agent).

    """

    def keys(model: str, base_url: str | None) -> tuple[str | None, bool]:
        key = session_key if sidebar_base_url and base_url and same_url(
            base_url, sidebar_base_url) else None
        return model_key(model, base_url=base_url, secrets=secrets, session_key=key)

    experiment = backoff is not None
    resolver = model_resolver(keys=keys, backoff=backoff, share=experiment,
                              streaming=not experiment, token_delay_s=token_delay_s)
    if not grader_pause_s:
        return resolver

    copies: dict[int, tuple[BaseChatModel, BaseChatModel]] = {}

    def paced(model: str, role: Role, base_url: str | None) -> BaseChatModel:
        from rubric_core.offline.graders import RulesGrader

        built = resolver(model, role, base_url)
        if not isinstance(built, RulesGrader):
            return built
        # One paced copy per model built, so an experiment's cells still share one.
        if id(built) not in copies:
            copies[id(built)] = (built, built.model_copy(update={"pause_s": grader_pause_s}))
        return copies[id(built)][1]

    return paced


@dataclass(frozen=True)
class ResumeChanges:
    """What the Run page's Resume changes in the run it continues (None: keep it)."""

    base_url: str | None = None
    """The server to send the run to (``""``: the provider's own endpoint)."""
    worker_model: str | None = None
    """The worker model to continue with."""
    grader_model: str | None = None
    """The grader model to continue with."""
    api_key: str | None = field(default=None, repr=False)
    """A key typed for that base URL: this session's memory only, never stored or shown."""


def resume_widget_keys(run_id: str) -> dict[str, str]:
    """Session-state keys of the Resume form's widgets for one run (so each run prefills)."""
    return {name: f"resume_{name}_{run_id}"
            for name in ("base_url", "worker_model", "grader_model", "api_key")}


def resume_changes(state: Mapping[str, Any], run_id: str) -> ResumeChanges:
    """The Resume form's values for ``run_id``, as typed (a widget not drawn keeps the run's)."""

    def value(name: str) -> str | None:
        raw = state.get(resume_widget_keys(run_id)[name])
        return raw.strip() if isinstance(raw, str) else None

    return ResumeChanges(base_url=value("base_url"), worker_model=value("worker_model") or None,
                         grader_model=value("grader_model") or None,
                         api_key=value("api_key") or None)


def changed_settings(settings: RunSettings, changes: ResumeChanges) -> RunSettings:
    """The settings a resume will run with (`rubric_core.session.resumed_settings`).

    Settings the change would break are shown unchanged; the resume itself reports why.
    """
    try:
        changed = resumed_settings(settings, base_url=changes.base_url,
                                   worker_model=changes.worker_model,
                                   grader_model=changes.grader_model)
    except ValueError:
        return settings
    return changed or settings


def resuming_text(record: RunRecord, changes: ResumeChanges) -> str:
    """What the Run page says while it resumes a run: which run, and what changed."""
    changed = changed_settings(record.settings, changes)
    before = record.settings
    moved = [f"{label} {getattr(changed, name) or 'the provider default'}"
             for name, label in (("base_url", "base URL"), ("worker_model", "worker"),
                                 ("grader_model", "grader"))
             if getattr(changed, name) != getattr(before, name)]
    how = ("with " + ", ".join(moved) + " (recorded in its settings)" if moved
           else "with the settings it was started with")
    return f"Resuming run {record.run_id[:8]} · {record.title or '(untitled)'} {how}."


def resume_models(
    secrets: Mapping[str, Any],
    changes: ResumeChanges,
    *,
    session_key: str | None,
    sidebar_base_url: str | None,
    token_delay_s: float,
    grader_pause_s: float = 0.0,
) -> ModelResolver:
    """The models of a resume (`app_models`): a key typed for it goes to its base URL only.

    Without a key typed in the Resume form, the sidebar's key and base URL rule applies.
    """
    if changes.api_key:
        return app_models(secrets, session_key=changes.api_key,
                          sidebar_base_url=changes.base_url or None, token_delay_s=token_delay_s,
                          grader_pause_s=grader_pause_s)
    return app_models(secrets, session_key=session_key, sidebar_base_url=sidebar_base_url,
                      token_delay_s=token_delay_s, grader_pause_s=grader_pause_s)


def check_form(
    settings: RunSettings, *, secrets: Mapping[str, Any], session_key: str | None = None
) -> list[UiMessage]:
    """What stops the run (errors) or deserves a look first (warnings); nothing is called.

    Returns:
        Messages, errors first.

    """
    out: list[UiMessage] = []
    if not settings.prompt.strip():
        out.append(UiMessage("error", "The prompt is empty: on the Author page, say what the "
                                      "worker should do (or load a bundled example)."))
    out += lint_for_ui(settings.rubric, settings.grader_model, list(settings.grader_tools))
    _, problem = check_max_iterations(settings.max_iterations)
    if problem:
        out.append(UiMessage("error", problem))
    if problem := check_judging(settings.grader_repeats, settings.consensus):
        out.append(UiMessage("error", problem + " Fix it in the sidebar."))
    for role, model in (("Worker", settings.worker_model), ("Grader", settings.grader_model)):
        reason = model_problem(model, base_url=settings.base_url, secrets=secrets,
                               session_key=session_key)
        if reason:
            out.append(UiMessage("error", f"{role} model: {reason} Choose another model in the "
                                          "sidebar."))
    try:
        build_grader_tools(settings.grader_tools, settings.example_name)
    except ValueError as exc:
        out.append(UiMessage("error", str(exc)))
    if (notice := demo_notice(settings)) is not None:
        out.append(notice)
    return sorted(out, key=lambda m: m.level != "error")


def demo_notice(settings: RunSettings) -> UiMessage | None:
    """A warning before the run when the offline ``demo`` worker cannot answer the prompt.

    The demo worker answers only the bundled examples and dataset rows
    (`rubric_core.offline.demo.demo_knows`); for any other prompt, say so and how to plug in a
    real model. None when the worker is another model, the prompt is empty or known.
    """
    from rubric_core.offline.demo import demo_knows

    if settings.worker_model.strip() != "demo" or not settings.prompt.strip():
        return None
    if demo_knows(settings.prompt):
        return None
    return UiMessage(
        "warning",
        "The offline `demo` worker does not know this prompt: it only answers the bundled "
        "examples (load one on the Author page), so this run would get the reply \"I can only "
        "answer the bundled examples\" instead of an answer. To run your own prompt, choose a "
        "real worker model in the sidebar: with an API key (set `OPENAI_API_KEY` or "
        "`ANTHROPIC_API_KEY` in the environment or `.streamlit/secrets.toml`), e.g. "
        "`openai:gpt-4.1-mini` or `anthropic:claude-haiku-4-5`; or with an OpenAI-compatible "
        "local server such as Ollama: start it (`ollama serve`, then `ollama pull llama3.1`), "
        "set the sidebar's base URL to `http://127.0.0.1:11434/v1` and choose "
        "`openai-compatible:llama3.1`.",
    )


def progress(iteration: int, cap: int) -> tuple[float, str]:
    """Progress bar value and text for the 0-based grader pass ``iteration``."""
    cap = max(cap, 1)
    k = min(iteration + 1, cap)
    return min(k / cap, 1.0), f"Pass {k} of {cap}"


def streaming_markdown(text: str) -> str:
    """`answer_markdown` of an answer still arriving: a tail that may start a key is held back.

    See `rubric_core.redact.redact_stream`.
    """
    return answer_markdown(redact_stream(text))


def answer_markdown(text: str) -> str:
    """Markdown that keeps the answer's line breaks (a haiku stays three lines).

    The Run page streams the worker's answer as it is written, before anything is stored, so
    it is scrubbed here (`rubric_core.redact`): a key the worker echoes is not shown.
    """
    text = redact(text)
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
    notes = pass_notes(evaluation)
    return (f"{icon} Pass {number}: **{evaluation.get('result')}**{counts}"
            + (f" ({notes})" if notes else ""))


def rule_decisions(evaluation: Mapping[str, Any], grader_model: str,
                   tool_names: Sequence[str] = ()) -> dict[str, str]:
    """For a ``hybrid:`` grader: who decided each criterion, and what the model said.

    The rules decide every criterion they read (`rubric_core.offline.rules.read`); where the
    LLM's verdict differed, the explanation lists the criterion
    (`rubric_core.offline.graders.overridden_criteria`) and the model said the opposite of
    the recorded verdict. Other graders: an empty mapping.

    Returns:
        Criterion name → e.g. ``decided by the rule (the model said pass)``.

    """
    if not grader_model.strip().startswith("hybrid:"):
        return {}
    from rubric_core.offline.graders import overridden_criteria
    from rubric_core.offline.rules import read

    overridden = set(overridden_criteria(str(evaluation.get("explanation") or "")))
    out: dict[str, str] = {}
    for criterion in evaluation.get("criteria") or []:
        name = str(criterion.get("name", ""))
        if read(name, tuple(tool_names)) is None:
            out[name] = "decided by the model"
        elif name in overridden:
            model_said = "fail" if criterion.get("passed") else "pass"
            out[name] = f"decided by the rule (the model said {model_said})"
        else:
            out[name] = "decided by the rule (the model agreed or did not say)"
    return out


def verdict_frame(evaluation: Mapping[str, Any], *, grader_model: str = "",
                  tool_names: Sequence[str] = ()) -> pd.DataFrame:
    """Per-criterion pass/fail table of one pass, with the gaps and notes (`criterion_note`).

    With a ``hybrid:`` grader the note says which of the rule and the model decided
    (`rule_decisions`).
    """
    repeats = evaluation.get("repeats")
    decided = rule_decisions(evaluation, grader_model, tool_names)
    rows = [
        {"criterion": row["criterion"], "passed": bool(row["passed"]), "gap": row["gap"] or "",
         "note": " · ".join(filter(None, (decided.get(str(row["criterion"])),
                                          criterion_note(row, repeats))))}
        for row in criterion_rows(evaluation) if row["index"] is not None
    ]
    return pd.DataFrame(rows, columns=["criterion", "passed", "gap", "note"])


@dataclass(frozen=True)
class Advice:
    """How the Run page presents a final status."""

    level: Level
    """How to show it."""
    headline: str
    """The status in words."""
    steps: tuple[str, ...] = ()
    """What to do next."""


def next_steps(
    status: str, *, error: str | None = None, grader_model: str = "", resumable: bool = False
) -> Advice:
    """The final status in words, and what to do next for anything but ``satisfied``.

    Args:
        status: The status to show (`rubric_core.session.run_status`).
        error: The run's error message, if any.
        grader_model: The run's grader (the rules grader gets its own advice).
        resumable: Whether the run is offered for Resume on this page
            (`rubric_core.session.is_resumable`); only then is Resume advised.

    """
    rules = grader_model.strip() == "rules"
    review = "Open the Review page to compare the iterations and see each criterion's gap."
    again = ("Its thread is saved: press Resume under “Interrupted runs” above to continue "
             "the same grading run."
             if resumable else "Start the run again from the form above.")
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
                                     "it finished.", (again,))
        case "error":
            detail = f" ({error})" if error else ""
            if resumable:
                return Advice("error", f"Final status: error — the run stopped on an "
                                       f"error{detail}.", (
                    "Check the worker model, its API key and the base URL (is the server "
                    "reachable from this machine?).",
                    "To finish this run, open “Resume with another endpoint or models” under "
                    "“Interrupted runs” above, correct them there and press Resume: the run "
                    "continues from its saved thread. Or start a new run.",
                ))
            return Advice("error", f"Final status: error — the run stopped on an error{detail}.", (
                "Check the worker model, its API key and the base URL in the sidebar (is the "
                "server reachable from this machine?).", "Once fixed, start the run again.",
            ))
        case "running":
            return Advice("info", "Status: running — the run has not finished.", (
                "It is being recorded by this server, another tab or another process: refresh "
                "in a moment. If that process died, the run is offered for Resume below once "
                "its heartbeat is stale.",
            ))
        case _:
            return Advice("info", f"Status: {status} — the run has not finished.", (again,))
