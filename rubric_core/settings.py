"""`RunSettings`: the one description of a run, from the page or the CLI to the store and back.

A run is described once, here, as plain data: what the worker is asked, the rubric, the model
strings, the base URL, the system prompts, the grader's tool names, the cap and where the run
came from (a bundled example, a dataset row). The Run page and the CLI build it from their
inputs; `rubric_core.session` runs it; the store keeps it whole as JSON beside the columns
Review filters on; Review, export and Resume read it back. It never holds a credential: keys
are passed when a run is started or resumed (`rubric_core.session`), never stored.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rubric_core.redact import redact, redact_data
from rubric_core.rubric import parse_criteria, validate_rubric
from rubric_core.types import (
    CONSENSUS_MODES,
    DEFAULT_GRADER_MAX_TOKENS,
    DEFAULT_WORKER_MAX_TOKENS,
    MAX_GRADER_REPEATS,
    MAX_ITERATIONS,
    MAX_OUTPUT_TOKENS,
)

if TYPE_CHECKING:
    from rubric_core.datasets import DatasetRow

TITLE_CHARS = 60
"""Longest run title taken from a prompt."""

_TEXT_FIELDS = ("prompt", "rubric", "worker_model", "grader_model", "worker_system_prompt",
                "grader_system_prompt", "title")


def validate_run_text(prompt: object, rubric: object, max_iterations: object) -> None:
    """The checks every run passes before a model is built: prompt, rubric, iteration cap.

    Raises:
        ValueError: Empty prompt or rubric, a rubric over the size limit or without criteria,
            or a cap that is not a whole number from 1 to the middleware's ``MAX_ITERATIONS``.

    """
    if not isinstance(prompt, str) or not prompt.strip():
        msg = "The prompt is empty: say what the worker should do."
        raise ValueError(msg)
    if not isinstance(rubric, str) or not rubric.strip():
        msg = "The rubric is empty: write at least one criterion, one per line."
        raise ValueError(msg)
    validate_rubric(rubric)
    if not parse_criteria(rubric):
        msg = ("The rubric has no criteria (only bullets or blank lines): write at least one "
               "criterion, one per line.")
        raise ValueError(msg)
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int):
        msg = "max_iterations must be a whole number"
        raise ValueError(msg)
    if not 1 <= max_iterations <= MAX_ITERATIONS:
        msg = f"max_iterations must be between 1 and {MAX_ITERATIONS}"
        raise ValueError(msg)


def _check_judging_types(grader_repeats: object, consensus: object, return_best: object) -> None:
    """Type checks of the verdict-stability options (ranges are checked by `validate`)."""
    if isinstance(grader_repeats, bool) or not isinstance(grader_repeats, int):
        msg = f"grader_repeats must be a whole number, got {type(grader_repeats).__name__}"
        raise TypeError(msg)
    if not isinstance(consensus, str):
        msg = f"consensus must be a string, got {type(consensus).__name__}"
        raise TypeError(msg)
    if not isinstance(return_best, bool):
        msg = f"return_best must be true or false, got {type(return_best).__name__}"
        raise TypeError(msg)


def validate_judging(grader_repeats: int, consensus: str) -> None:
    """The ranges `RubricMiddleware` accepts for ``grader_repeats`` and ``consensus``.

    Raises:
        ValueError: Repeats outside 1 to ``MAX_GRADER_REPEATS``, or an unknown consensus mode.

    """
    if not 1 <= grader_repeats <= MAX_GRADER_REPEATS:
        msg = f"grader_repeats must be from 1 to {MAX_GRADER_REPEATS}, got {grader_repeats}"
        raise ValueError(msg)
    if consensus not in CONSENSUS_MODES:
        msg = f"consensus must be one of {', '.join(CONSENSUS_MODES)}, got {consensus!r}"
        raise ValueError(msg)


MAX_TOKENS_FIELDS = ("worker_max_tokens", "grader_max_tokens")
"""The output token limits a run or a configuration sets (None: the default for the model)."""


def check_max_tokens(name: str, value: object) -> None:
    """An output token limit: None (the model's default) or a whole number of tokens.

    Raises:
        TypeError: Not None and not a whole number.
        ValueError: Below 1 or above ``MAX_OUTPUT_TOKENS``.

    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{name} must be a whole number of tokens or None, got {type(value).__name__}"
        raise TypeError(msg)
    if not 1 <= value <= MAX_OUTPUT_TOKENS:
        msg = (f"{name} must be from 1 to {MAX_OUTPUT_TOKENS:,} tokens, got {value} (None: "
               f"{DEFAULT_WORKER_MAX_TOKENS:,} for a worker and {DEFAULT_GRADER_MAX_TOKENS:,} "
               "for a grader on a base URL, the provider's own limit for other models)")
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything that describes one run; JSON-round-tripping, never a credential.

    Construction checks types only (so that a half-filled form can be described and its
    problems reported); :meth:`validate` says whether it can run.
    """

    prompt: str
    """What the worker is asked."""
    rubric: str
    """The rubric text: one criterion per line or bullet."""
    worker_model: str = "demo"
    """``provider:model`` of the worker (``demo`` is the offline one)."""
    grader_model: str = "rules"
    """``provider:model`` of the grader (``rules`` is the offline one)."""
    base_url: str | None = None
    """OpenAI-compatible server for ``openai``/``openai-compatible`` models; None: the default."""
    worker_system_prompt: str = ""
    """The worker's system prompt (``""`` for none)."""
    grader_system_prompt: str = ""
    """A custom grader prompt (``""`` for the built-in one)."""
    grader_tools: tuple[str, ...] = ()
    """Names of the grader's evidence tools (built by `rubric_core.session.build_grader_tools`)."""
    max_iterations: int = 3
    """Cap on grader passes, 1 to the middleware's ``MAX_ITERATIONS``."""
    example_name: str | None = None
    """The bundled example the run came from (its tools carry its test cases or schema)."""
    title: str = ""
    """Short human label; `rubric_core.session.start` fills it with :func:`run_title`."""
    dataset_row: dict[str, Any] | None = None
    """The dataset row the run was made from (experiments); JSON values only."""
    grader_repeats: int = 1
    """Gradings of each answer; the per-criterion verdict is their consensus (1: the seed's)."""
    consensus: str = "majority"
    """How repeats combine: ``majority`` (a tie fails) or ``unanimous``."""
    return_best: bool = False
    """At the cap, end with the best attempt's answer instead of the last one."""
    worker_max_tokens: int | None = None
    """The worker's output token limit per reply; None: `DEFAULT_WORKER_MAX_TOKENS` for a
    model on a base URL, the provider's own limit for others (`rubric_core.models.
    limit_output`). A reply cut at it is recorded as such (``answer_cut``)."""
    grader_max_tokens: int | None = None
    """The grader's output token limit per reply; None: `DEFAULT_GRADER_MAX_TOKENS` for a
    model on a base URL, the provider's own limit for others."""
    force_grader_tools: bool = False
    """The grader calls each of its tools once, each call forced, before its verdict (for
    small models that never choose a tool; `RubricMiddleware` ``force_tools``)."""

    def __post_init__(self) -> None:
        _check_judging_types(self.grader_repeats, self.consensus, self.return_best)
        if not isinstance(self.force_grader_tools, bool):
            msg = f"force_grader_tools must be true or false, got {self.force_grader_tools!r}"
            raise TypeError(msg)
        for name in MAX_TOKENS_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                msg = f"{name} must be a whole number of tokens or None, got {value!r}"
                raise TypeError(msg)
        for name in _TEXT_FIELDS:
            if not isinstance(getattr(self, name), str):
                msg = f"{name} must be a string, got {type(getattr(self, name)).__name__}"
                raise TypeError(msg)
        for name in ("base_url", "example_name"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                msg = f"{name} must be a string or None, got {type(value).__name__}"
                raise TypeError(msg)
            object.__setattr__(self, name, (value or "").strip() or None)
        tools = self.grader_tools
        if isinstance(tools, str) or not isinstance(tools, Sequence):
            msg = f"grader_tools must be a list of tool names, got {type(tools).__name__}"
            raise TypeError(msg)
        for tool in tools:
            if not isinstance(tool, str):
                msg = f"grader_tools item must be a string, got {type(tool).__name__}"
                raise TypeError(msg)
        object.__setattr__(self, "grader_tools", tuple(tools))
        if self.base_url is not None:
            _check_base_url(self.base_url)
        if self.dataset_row is not None:
            if not isinstance(self.dataset_row, Mapping):
                msg = f"dataset_row must be a mapping, got {type(self.dataset_row).__name__}"
                raise TypeError(msg)
            try:  # a copy, and proof that it travels as JSON
                row = json.loads(json.dumps(dict(self.dataset_row), ensure_ascii=False))
            except (TypeError, ValueError) as exc:
                msg = f"dataset_row must hold JSON values only: {exc}"
                raise TypeError(msg) from exc
            object.__setattr__(self, "dataset_row", row)

    def validate(self) -> None:
        """Reject settings that cannot run, before any model is built or called.

        Raises:
            ValueError: Empty prompt or rubric, a bad rubric, a bad iteration cap, a model
                left blank, grader repeats or a consensus mode the middleware refuses, or an
                output token limit out of range.

        """
        validate_run_text(self.prompt, self.rubric, self.max_iterations)
        validate_judging(self.grader_repeats, self.consensus)
        for name in MAX_TOKENS_FIELDS:
            check_max_tokens(name, getattr(self, name))
        if not self.worker_model.strip() or not self.grader_model.strip():
            msg = "worker_model and grader_model must name a model, e.g. 'openai:gpt-4o-mini'"
            raise ValueError(msg)

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready values (tool names as a list)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["grader_tools"] = list(self.grader_tools)
        return out

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces); ``from_json(s.to_json()) == s``."""
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunSettings:
        """Settings from :meth:`to_dict`'s shape.

        Raises:
            ValueError: Not a mapping, unknown keys, or ``prompt``/``rubric`` missing.
            TypeError: A value of the wrong type.

        """
        if not isinstance(data, Mapping):
            msg = f"run settings must be a JSON object, got {type(data).__name__}"
            raise ValueError(msg)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            msg = f"unknown run setting(s) {unknown}; known: {sorted(known)}"
            raise ValueError(msg)
        missing = [name for name in ("prompt", "rubric") if name not in data]
        if missing:
            msg = f"run settings lack {missing}"
            raise ValueError(msg)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RunSettings:
        """Settings from :meth:`to_json`'s text.

        Raises:
            ValueError: Not JSON, or not settings (see :meth:`from_dict`).

        """
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            msg = f"run settings are not valid JSON: {exc}"
            raise ValueError(msg) from exc
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with some fields changed (checked like a new instance)."""
        return dataclasses.replace(self, **changes)

    def titled(self) -> RunSettings:
        """These settings with :attr:`title` filled by :func:`run_title` when it is empty."""
        return self if self.title.strip() else self.replace(title=run_title(self))

    def redacted(self) -> RunSettings:
        """A copy with known secrets scrubbed from every text (what the store keeps)."""
        texts = {name: redact(getattr(self, name)) for name in (*_TEXT_FIELDS, "base_url")
                 if getattr(self, name) is not None}
        row = redact_data(self.dataset_row) if self.dataset_row is not None else None
        return self.replace(**texts, dataset_row=row,
                            grader_tools=tuple(redact(t) for t in self.grader_tools))

    @classmethod
    def from_columns(
        cls,
        *,
        title: str,
        prompt: str,
        rubric: str,
        worker_model: str,
        grader_model: str,
        max_iterations: int,
        worker_system_prompt: str | None,
        grader_system_prompt: str | None,
        grader_tools: Sequence[str] | None,
    ) -> RunSettings:
        """Settings for a run stored before they were kept whole (schema 1 and 2 rows).

        A run whose prompt and rubric are a bundled example's takes the example back (name,
        and its system prompt and tools where the row did not record them). Rows from before
        system prompts and tools were recorded (None) get the defaults, with the general tools
        the rubric names. The base URL was never recorded: None.
        """
        from rubric_core.examples import list_examples
        from rubric_core.tools import DEFAULT_TOOLS

        example = next((e for e in list_examples()
                        if e.prompt == prompt and e.rubric == rubric), None)
        if grader_tools is None:
            if example is not None:
                worker_system_prompt = example.worker_system_prompt
                grader_tools = [t.name for t in example.grader_tools()]
            else:
                grader_tools = [name for name in DEFAULT_TOOLS if name in rubric]
        return cls(
            prompt=prompt, rubric=rubric, worker_model=worker_model, grader_model=grader_model,
            worker_system_prompt=worker_system_prompt or "",
            grader_system_prompt=grader_system_prompt or "", grader_tools=tuple(grader_tools),
            max_iterations=max_iterations, example_name=example.name if example else None,
            title=title,
        )


ASSIGNMENT_KEYS = {
    "worker": "worker_model", "grader": "grader_model", "rubric": "rubric",
    "system": "worker_system_prompt", "tools": "grader_tools", "cap": "max_iterations",
    "max_iterations": "max_iterations", "label": "label", "base_url": "base_url",
    "grader_repeats": "grader_repeats", "consensus": "consensus", "return_best": "return_best",
    "max_tokens": "worker_max_tokens", "grader_max_tokens": "grader_max_tokens",
}
"""The keys `ExperimentConfig.from_assignments` reads, by the field each one sets."""

_YES = frozenset({"yes", "true", "1", "on"})
_NO = frozenset({"no", "false", "0", "off"})


class ConfigSyntaxError(ValueError):
    """A configuration written as ``KEY=VALUE,...`` that cannot be read.

    The message starts with the text as given, so a caller can say where it came from.
    """


def check_known_fields(cls: Any, data: Mapping[str, Any], what: str) -> None:
    """Refuse keys of ``data`` that are not fields of the dataclass ``cls``.

    Raises:
        ValueError: Unknown keys, named with the known ones (``what`` names the record).

    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        msg = f"unknown {what} setting(s) {unknown}; known: {sorted(known)}"
        raise ValueError(msg)


@dataclasses.dataclass(frozen=True, slots=True)
class ExperimentConfig:
    """One configuration of an experiment: the models, rubric and prompts every row runs with.

    A cell of the experiment is a dataset row run with a configuration: `settings_for` gives
    its `RunSettings`, so a cell is an ordinary run (Review, export and Resume read it as one).
    Like `RunSettings` it round-trips through JSON and never holds a credential.
    """

    worker_model: str = "demo"
    """``provider:model`` of the worker."""
    grader_model: str = "rules"
    """``provider:model`` of the grader."""
    rubric: str = ""
    """The experiment's rubric for rows without their own (``""``: every row must have one)."""
    rubric_name: str | None = None
    """The saved rubric it came from, for labels (None when typed in)."""
    rubric_version: int | None = None
    """That rubric's version."""
    worker_system_prompt: str = ""
    """The worker's system prompt (``""`` for none)."""
    grader_tools: tuple[str, ...] = ()
    """Names of the grader's evidence tools."""
    max_iterations: int = 3
    """Cap on grader passes per cell."""
    base_url: str | None = None
    """OpenAI-compatible server for ``openai``/``openai-compatible`` models."""
    label: str = ""
    """Short human label; `display_label` derives one when empty."""
    grader_repeats: int = 1
    """Gradings of each answer (`RunSettings.grader_repeats`)."""
    consensus: str = "majority"
    """How repeats combine (`RunSettings.consensus`)."""
    return_best: bool = False
    """At the cap, end with the best attempt (`RunSettings.return_best`)."""
    worker_max_tokens: int | None = None
    """The worker's output token limit (`RunSettings.worker_max_tokens`)."""
    grader_max_tokens: int | None = None
    """The grader's output token limit (`RunSettings.grader_max_tokens`)."""

    def __post_init__(self) -> None:
        _check_judging_types(self.grader_repeats, self.consensus, self.return_best)
        tools = self.grader_tools
        if isinstance(tools, str) or not isinstance(tools, Sequence):
            msg = f"grader_tools must be a list of tool names, got {type(tools).__name__}"
            raise TypeError(msg)
        object.__setattr__(self, "grader_tools", tuple(str(t) for t in tools))
        object.__setattr__(self, "base_url", (self.base_url or "").strip() or None)

    def display_label(self) -> str:
        """The label, else ``worker × grader`` (with the rubric's name and version)."""
        if self.label.strip():
            return self.label.strip()
        text = f"{self.worker_model} × {self.grader_model}"
        if self.rubric_name:
            version = f" v{self.rubric_version}" if self.rubric_version else ""
            text += f" · {self.rubric_name}{version}"
        return text

    def settings_for(self, row: DatasetRow) -> RunSettings:
        """The run of one dataset row under this configuration (``dataset_row`` set).

        The row's own rubric wins over the configuration's. ``dataset_row`` keeps the row's
        id, prompt, own rubric and variables, so the dataset's columns travel with the run.

        Raises:
            ValueError: The row has no rubric and neither has the configuration.

        """
        rubric = row.rubric or self.rubric
        if not rubric.strip():
            msg = (f"dataset row {row.id!r} has no 'rubric' and the configuration gives none: "
                   "pass a rubric for the experiment (--rubric) or add a 'rubric' column")
            raise ValueError(msg)
        record: dict[str, Any] = {"id": row.id, "prompt": row.prompt, "rubric": row.rubric,
                                  **row.variables}
        return RunSettings(
            prompt=row.prompt, rubric=rubric, worker_model=self.worker_model,
            grader_model=self.grader_model, base_url=self.base_url,
            worker_system_prompt=self.worker_system_prompt, grader_tools=self.grader_tools,
            max_iterations=self.max_iterations, dataset_row=record,
            grader_repeats=self.grader_repeats, consensus=self.consensus,
            return_best=self.return_best, worker_max_tokens=self.worker_max_tokens,
            grader_max_tokens=self.grader_max_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-ready values."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["grader_tools"] = list(self.grader_tools)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentConfig:
        """A configuration from :meth:`to_dict`'s shape.

        Raises:
            ValueError: Unknown keys.

        """
        check_known_fields(cls, data, "configuration")
        return cls(**data)

    @classmethod
    def from_assignments(
        cls, text: str, *, read_text: Callable[[str, str], str] | None = None
    ) -> ExperimentConfig:
        """A configuration written as ``worker=M,grader=G,cap=3,...`` (the CLI's ``--config``).

        Keys are those of `ASSIGNMENT_KEYS`; ``tools`` takes names joined by ``+``, ``cap``
        and ``grader_repeats`` whole numbers, ``max_tokens`` and ``grader_max_tokens`` whole
        numbers of tokens (0: the model's default), ``return_best`` yes/no (true/false, 1/0,
        on/off). Ranges are checked where every configuration's are, by `RunSettings.validate`
        (`rubric_core.experiments.create_experiment` calls it).

        Args:
            text: The comma-separated ``KEY=VALUE`` pairs.
            read_text: Turns a ``rubric`` or ``system`` value into its text, given the value
                and its key (the CLI reads ``@FILE`` with it); None: the value as written.

        Raises:
            ConfigSyntaxError: A part that is not ``KEY=VALUE`` with a known key, or a value
                that is not a whole number or a yes/no where one is needed.

        """
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            field = ASSIGNMENT_KEYS.get(key)
            if not sep or field is None:
                msg = (f"{text!r}: {part!r} is not KEY=VALUE with KEY one of "
                       f"{', '.join(sorted(ASSIGNMENT_KEYS))}")
                raise ConfigSyntaxError(msg)
            if field in ("rubric", "worker_system_prompt"):
                values[field] = read_text(value, key) if read_text else value
            elif field == "grader_tools":
                values[field] = tuple(t for t in value.split("+") if t)
            elif field in ("max_iterations", "grader_repeats", *MAX_TOKENS_FIELDS):
                try:
                    values[field] = int(value)
                except ValueError:
                    msg = f"{text!r}: {key} must be a whole number"
                    raise ConfigSyntaxError(msg) from None
                if field in MAX_TOKENS_FIELDS:
                    values[field] = values[field] or None  # 0: the model's default
            elif field == "return_best":
                if value.lower() not in _YES | _NO:
                    msg = f"{text!r}: return_best must be yes or no"
                    raise ConfigSyntaxError(msg)
                values[field] = value.lower() in _YES
            else:
                values[field] = value
        return cls(**values)


def run_title(settings: RunSettings) -> str:
    """The run's label: the bundled example's title, else the prompt's start.

    The example's title only while the prompt is the example's: a prompt edited away from it
    is the user's own run, titled after what it asks. The app, the CLI and so the export's
    ``run_title`` all use it.
    """
    if settings.example_name:
        from rubric_core.examples import get_example

        try:
            example = get_example(settings.example_name)
        except KeyError:
            pass
        else:
            if " ".join(example.prompt.split()) == " ".join(settings.prompt.split()):
                return example.title
    first = " ".join(settings.prompt.split())
    return first if len(first) <= TITLE_CHARS else first[: TITLE_CHARS - 1] + "…"


def _check_base_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None or parts.password is not None:
        msg = ("The base URL carries a user name or password: give the server's URL alone and "
               "pass its key separately (it is never stored with a run).")
        raise ValueError(msg)
