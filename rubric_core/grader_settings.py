"""A grader configuration of a re-grade: the rubric version and how it is graded.

A `GraderConfig` is to a re-grade what `rubric_core.settings.ExperimentConfig` is to an
experiment: one frozen description, stored as JSON with its job, never holding a credential.
Only the grader runs in a re-grade, so it holds no worker: the rubric (and the saved version it
came from), the grader model and endpoint, a custom grader prompt, evidence tools, repeats and
their consensus, and whether Align's few-shot examples from the set's labels are added.

``label_criteria`` says which of people's labelled criteria a criterion is judged against when
its wording differs from the label's (a reworded criterion keeps the verdicts people gave the
original; both parts of a split do). Without an entry a criterion is judged against the labels
whose criterion has the same name (`rubric_core.rubric.normalize_name`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from rubric_core.rubric import normalize_name, parse_criteria, validate_rubric
from rubric_core.settings import check_known_fields, check_max_tokens, validate_judging


@dataclasses.dataclass(frozen=True, slots=True)
class GraderConfig:
    """How the answers of a re-grade are graded (see the module docstring)."""

    rubric: str
    """The rubric text: one criterion per line."""
    grader_model: str = "rules"
    """``provider:model`` of the grader (`rubric_core.models`)."""
    base_url: str | None = None
    """OpenAI-compatible server for ``openai``/``openai-compatible`` graders."""
    grader_system_prompt: str = ""
    """A custom grader prompt (``""``: the built-in one)."""
    grader_tools: tuple[str, ...] = ()
    """Names of the grader's evidence tools (`rubric_core.session.build_grader_tools`)."""
    grader_repeats: int = 1
    """Gradings of each answer (1 to `rubric_core.types.MAX_GRADER_REPEATS`)."""
    consensus: str = "majority"
    """How repeats combine (`rubric_core.consensus`)."""
    few_shot: bool = False
    """Add Align's few-shot examples from the set's labels (never an answer's own labels)."""
    rubric_name: str | None = None
    """The saved rubric it came from (None when typed in)."""
    rubric_version: int | None = None
    """That rubric's version."""
    label: str = ""
    """Short human label; `display_label` derives one when empty."""
    label_criteria: tuple[tuple[str, str], ...] = ()
    """(criterion, labelled criterion) pairs: whose people's verdicts a reworded or split
    criterion is judged against."""
    max_tokens: int | None = None
    """The grader's output token limit per reply (`rubric_core.settings.RunSettings.
    grader_max_tokens`; None: the default for the model)."""

    def __post_init__(self) -> None:
        tools = self.grader_tools
        if isinstance(tools, str) or not isinstance(tools, Sequence):
            msg = f"grader_tools must be a list of tool names, got {type(tools).__name__}"
            raise TypeError(msg)
        object.__setattr__(self, "grader_tools", tuple(str(t) for t in tools))
        object.__setattr__(self, "base_url", (self.base_url or "").strip() or None)
        pairs: Any = self.label_criteria
        if isinstance(pairs, Mapping):
            pairs = pairs.items()
        object.__setattr__(self, "label_criteria", tuple((str(a), str(b)) for a, b in pairs))

    @property
    def criteria(self) -> list[str]:
        """The rubric's criteria, as the grader is asked them."""
        return parse_criteria(self.rubric)

    def validate(self) -> None:
        """Refuse a configuration that cannot grade, before anything is stored.

        Raises:
            ValueError: An empty or oversized rubric, no grader model, repeats, consensus or
                output token limit out of range (each message says what to change).

        """
        validate_rubric(self.rubric)
        if not self.criteria:
            msg = "the rubric has no criteria: write one criterion per line"
            raise ValueError(msg)
        if not self.grader_model.strip():
            msg = "a grader configuration needs a grader model (e.g. 'rules')"
            raise ValueError(msg)
        if isinstance(self.grader_repeats, bool) or not isinstance(self.grader_repeats, int):
            msg = f"grader_repeats must be a whole number, got {self.grader_repeats!r}"
            raise ValueError(msg)
        validate_judging(self.grader_repeats, self.consensus)
        try:
            check_max_tokens("max_tokens", self.max_tokens)
        except TypeError as exc:
            raise ValueError(str(exc)) from exc

    def labelled_as(self, criterion: str) -> str:
        """The labelled criterion (normalised) whose people's verdicts judge ``criterion``."""
        key = normalize_name(criterion)
        for name, labelled in self.label_criteria:
            if normalize_name(name) == key:
                return normalize_name(labelled)
        return key

    def display_label(self) -> str:
        """The label, else ``grader · rubric name vN`` (or ``grader · N criteria``)."""
        if self.label.strip():
            return self.label.strip()
        if self.rubric_name:
            version = f" v{self.rubric_version}" if self.rubric_version else ""
            return f"{self.grader_model} · {self.rubric_name}{version}"
        return f"{self.grader_model} · {len(self.criteria)} criteria"

    def replace(self, **changes: Any) -> GraderConfig:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as JSON-ready values."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["grader_tools"] = list(self.grader_tools)
        out["label_criteria"] = [list(p) for p in self.label_criteria]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GraderConfig:
        """A configuration from :meth:`to_dict`'s shape.

        Raises:
            ValueError: Unknown keys.

        """
        check_known_fields(cls, data, "grader configuration")
        return cls(**data)
