"""Authoring: lint, the criteria table, examples, the rubric library, grader tools."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pandas as pd

from rubric_core.app_support._common import LLM_GRADER_HINT, UiMessage
from rubric_core.examples import get_example, list_examples
from rubric_core.rubric import lint_rubric, parse_criteria
from rubric_core.store import StoreError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, MutableMapping, Sequence

    from langchain_core.tools import BaseTool

    from rubric_core.settings import RunSettings
    from rubric_core.store import Store


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


def leave_example_if_edited(state: MutableMapping[str, Any]) -> None:
    """Prompt callback: a prompt edited away from the loaded example makes the run the user's.

    While the prompt is the example's, the run is the example's (its title, its worker system
    prompt, its own grader tools with their test cases or schema). Once the prompt says
    something else, none of that fits: the example is dropped, so the run is titled after the
    prompt, and what the example set that the form hides (its worker system prompt, its own
    tools) is cleared, with a notice saying so. What the user changed is kept.
    """
    name = state.get("example_name")
    if not name:
        return
    try:
        example = get_example(name)
    except KeyError:
        state["example_name"] = None
        return
    prompt = state.get("prompt")
    if isinstance(prompt, str) and " ".join(prompt.split()) == " ".join(example.prompt.split()):
        return
    state["example_name"] = None
    cleared: list[str] = []
    system = example.worker_system_prompt
    if system and state.get("worker_system_prompt") == system:
        state["worker_system_prompt"] = ""
        cleared.append("its worker system prompt")
    own = {t.name for t in example.grader_tools()} - set(default_tool_names())
    tools = list(state.get("grader_tools") or [])
    if any(t in own for t in tools):
        state["grader_tools"] = [t for t in tools if t not in own]
        cleared.append("its own grader tools")
    what = f" {' and '.join(cleared)} {'were' if len(cleared) > 1 else 'was'} cleared." if (
        cleared) else ""
    state["author_notice"] = UiMessage(
        "info", f"The prompt is no longer the example “{example.title}”: the run is yours, "
                f"titled after your prompt.{what}")


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
    """Fresh tool instances for the grader, by name (`rubric_core.session.build_grader_tools`).

    Raises:
        ValueError: A name is neither a default tool nor one of the example's.

    """
    from rubric_core.session import build_grader_tools

    return build_grader_tools(names, example_name)


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


def welcome_message(prompt: str, rubric: str) -> UiMessage | None:
    """What an untouched form says instead of lint errors (a first visit), else None."""
    if prompt.strip() or rubric.strip():
        return None
    return UiMessage(
        "info",
        "New here? Pick a bundled example above and press **Load example**: it fills in the "
        "prompt, the rubric and the grader tools, and runs offline with the `demo` worker and "
        "the `rules` grader. Or write your own prompt and rubric, one criterion per line.",
    )


def sandbox_summary() -> UiMessage:
    """One line for the sidebar: which sandbox graded code runs in, or why it cannot run."""
    from rubric_core.tools.isolation import sandbox_status

    status = sandbox_status()
    if status.mode == "bwrap":
        return UiMessage("caption", "Code sandbox: bubblewrap (kernel-isolated).")
    if status.ready:
        return UiMessage("warning", "Code sandbox: unsafe-process. " + status.detail)
    return UiMessage("warning", "Code sandbox: unavailable. " + status.detail)


def sandbox_messages(names: Iterable[str], example_name: str | None = None) -> list[UiMessage]:
    """What to say before a run whose grader tools execute code: nothing when they can run.

    Returns an error when code-running tools are chosen but no sandbox is available (the tools
    would only ever report that), a warning in the unsafe-process mode, else nothing.
    """
    from rubric_core.tools.isolation import sandbox_status
    from rubric_core.tools.python_tests import RUNS_CODE

    try:
        tools = build_tools(names, example_name)
    except ValueError:
        return []  # reported where the tools are built
    running = [t.name for t in tools if (t.metadata or {}).get(RUNS_CODE)]
    if not running:
        return []
    status = sandbox_status()
    listed = ", ".join(f"`{name}`" for name in running)
    if not status.ready:
        return [UiMessage("error", f"The grader tool(s) {listed} run the candidate's code, "
                                   f"which cannot happen on this machine. {status.detail}")]
    if status.mode != "bwrap":
        return [UiMessage("warning", f"The grader tool(s) {listed} will run the candidate's "
                                     f"code without kernel isolation. {status.detail}")]
    return []


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
    tool_names = tuple(tool_names)
    for issue in lint_rubric(rubric, tool_names=tool_names):
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


def load_library_rubric(state: MutableMapping[str, Any], store: Store) -> None:
    """Button callback: put the chosen saved rubric version, and its preset, into the form.

    Reads ``library_select`` and ``library_version`` from ``state``; leaves a message in
    ``state["author_notice"]``. A version saved with a `RunSettings` preset also sets the
    prompt, system prompts, grader tools, models, base URL and iteration cap
    (`apply_preset`); one saved without (before presets were kept) sets the rubric alone.
    """
    name = state.get("library_select")
    version = state.get("library_version")
    if not name:
        state["author_notice"] = UiMessage("warning", "Choose a saved rubric to load first.")
        return
    wanted = version if isinstance(version, int) else None
    try:
        text = store.load_rubric(name, wanted)
        preset = store.load_preset(name, wanted)
    except (KeyError, ValueError, StoreError) as exc:
        state["author_notice"] = UiMessage("error", f"Could not load the rubric: {exc}")
        return
    state["rubric_text"] = text
    state["rubric_name"] = name
    label = f"version {version}" if isinstance(version, int) else "latest version"
    if preset is None:
        state["author_notice"] = UiMessage(
            "success", f"Loaded “{name}” ({label}): the rubric only, as this version was saved "
                       "without a prompt and settings.")
        return
    apply_preset(state, preset)
    state["author_notice"] = UiMessage(
        "success", f"Loaded “{name}” ({label}) with its prompt, grader tools and settings.")


def apply_preset(state: MutableMapping[str, Any], preset: RunSettings) -> None:
    """Fill the form and the sidebar's model settings from a saved preset."""
    state["prompt"] = preset.prompt
    state["rubric_text"] = preset.rubric
    state["worker_system_prompt"] = preset.worker_system_prompt
    state["grader_system_prompt"] = preset.grader_system_prompt
    state["grader_tools"] = list(preset.grader_tools)
    state["example_name"] = preset.example_name
    state["worker_model"] = preset.worker_model
    state["grader_model"] = preset.grader_model
    state["base_url"] = preset.base_url or ""
    state["max_iterations"] = preset.max_iterations
    state["grader_repeats"] = preset.grader_repeats
    state["consensus"] = preset.consensus
    state["return_best"] = preset.return_best


def save_library_rubric(
    store: Store, name: str, text: str, preset: RunSettings | None = None
) -> UiMessage:
    """Save the rubric (with the form's settings as its preset); the outcome as a message.

    Saving the same text and preset as the latest version writes nothing and says so.
    """
    try:
        version, created = store.save_rubric_version(name, text, settings=preset)
    except (ValueError, TypeError, StoreError) as exc:
        return UiMessage("error", f"Not saved: {exc}")
    if not created:
        return UiMessage("info", f"“{name.strip()}” unchanged: version {version} kept.")
    with_preset = " with its prompt, grader tools and settings" if preset is not None else ""
    return UiMessage("success", f"Saved “{name.strip()}” as version {version}{with_preset}.")
