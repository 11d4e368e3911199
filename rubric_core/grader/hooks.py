"""The grader middleware's settings: what `RubricMiddleware` is given for its grader, checked.

`GraderHooks` holds ``grader_middleware``, ``grader_context_schema``, ``grader_state_schema``
and ``build_grader_state`` with deepagents 0.7.32's meaning (README, "Grader middleware"), each
checked when the middleware is built, and makes each pass's grader runs
(`rubric_core.grader.hook_run.GraderRun`, which runs the hooks around every step). A run's
state is ``messages`` plus the fields ``build_grader_state`` added; its runtime's context is
the agent's (`coerce_context`), its store and stream writer the agent's too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware
from langgraph.runtime import Runtime
from pydantic import BaseModel
from typing_extensions import is_typeddict

from rubric_core.grader.hook_run import GraderRun

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from langchain_core.tools import BaseTool


def coerce_context(schema: type[Any] | None, context: Any) -> Any:
    """The grader's runtime context: a dict made ``schema`` when it is a dataclass or model.

    LangGraph's rule for a graph's ``context_schema``; any other context is passed as it is.
    """
    if schema is None or not isinstance(context, dict):
        return context
    if dataclasses.is_dataclass(schema) or issubclass(schema, BaseModel):
        return schema(**context)
    return context


def _schema_keys(schema: Any) -> frozenset[str]:
    keys = getattr(schema, "__required_keys__", frozenset()) | getattr(
        schema, "__optional_keys__", frozenset())
    return frozenset(keys) or frozenset(getattr(schema, "__annotations__", {}))


def _checked_middleware(middleware: object) -> tuple[AgentMiddleware[Any, Any, Any], ...]:
    if middleware is None:
        return ()
    if not isinstance(middleware, list | tuple):
        msg = ("grader_middleware must be a list of AgentMiddleware instances "
               f"(langchain.agents.middleware), got {type(middleware).__name__}")
        raise TypeError(msg)
    names: set[str] = set()
    for i, entry in enumerate(middleware):
        if not isinstance(entry, AgentMiddleware):
            msg = (f"grader_middleware[{i}] must be an AgentMiddleware instance "
                   f"(langchain.agents.middleware), got {type(entry).__name__}")
            raise TypeError(msg)
        if entry.name in names:
            msg = (f"grader_middleware has two middleware named {entry.name!r}: give each "
                   "instance its own name, or pass it once")
            raise ValueError(msg)
        names.add(entry.name)
        if tools := list(getattr(entry, "tools", None) or ()):
            listed = ", ".join(getattr(t, "name", type(t).__name__) for t in tools)
            msg = (f"grader_middleware[{i}] ({entry.name}) brings tools ({listed}), which the "
                   "grader does not take from middleware: pass evidence tools as "
                   "RubricMiddleware(tools=[...])")
            raise ValueError(msg)
    return tuple(middleware)


@dataclasses.dataclass(frozen=True)
class GraderHooks:
    """The grader's middleware, schemas and state builder, checked (`GraderHooks.create`)."""

    middleware: tuple[AgentMiddleware[Any, Any, Any], ...] = ()
    """Applied to every grader call, first outermost."""
    context_schema: type[Any] | None = None
    """What the grader's runtime context is made (`coerce_context`)."""
    state_schema: type[Any] | None = None
    """The grader state's TypedDict (an ``AgentState``), declaring the built fields."""
    build_state: Callable[[Any, int], Mapping[str, Any]] | None = None
    """``(agent state, iteration) -> fields`` added to the grader's state, once per pass."""

    @classmethod
    def create(
        cls, *, middleware: Sequence[AgentMiddleware[Any, Any, Any]] | None = None,
        context_schema: type[Any] | None = None, state_schema: type[Any] | None = None,
        build_state: Callable[[Any, int], Mapping[str, Any]] | None = None,
    ) -> GraderHooks:
        """The hooks, each argument checked as ``RubricMiddleware`` documents it.

        Raises:
            TypeError: A middleware entry, schema or callback of the wrong kind.
            ValueError: ``build_state`` without ``state_schema``, or two middleware of a name,
                or middleware that brings tools.

        """
        checked = _checked_middleware(middleware)
        if context_schema is not None and not isinstance(context_schema, type):
            msg = ("grader_context_schema must be a class (a dataclass, pydantic model or "
                   f"TypedDict), got {type(context_schema).__name__}")
            raise TypeError(msg)
        if state_schema is not None and not (
                is_typeddict(state_schema) and "messages" in _schema_keys(state_schema)):
            msg = ("grader_state_schema must be a TypedDict that extends AgentState (from "
                   f"langchain.agents import AgentState), got {state_schema!r}")
            raise TypeError(msg)
        if build_state is not None and not callable(build_state):
            msg = "build_grader_state must be callable: (state, iteration) -> mapping"
            raise TypeError(msg)
        if build_state is not None and state_schema is None:
            msg = ("`grader_state_schema` is required with `build_grader_state`: declare the "
                   "fields it adds in a TypedDict that extends AgentState")
            raise ValueError(msg)
        return cls(checked, context_schema, state_schema, build_state)

    @property
    def active(self) -> bool:
        """Whether grader calls go through hooks at all (without, the drivers call directly)."""
        return bool(self.middleware or self.context_schema or self.state_schema)

    def fields(self, state: Mapping[str, Any], iteration: int) -> dict[str, Any]:
        """What ``build_grader_state`` adds to the grader's state for this pass, checked.

        Raises:
            TypeError: It returned something other than a mapping.
            ValueError: It set ``messages``, or a field no state schema declares (the grader's
                would drop it).

        """
        if self.build_state is None:
            return {}
        built = self.build_state(state, iteration)
        if not isinstance(built, Mapping):
            msg = f"build_grader_state must return a mapping, got {type(built).__name__}"
            raise TypeError(msg)
        if "messages" in built:
            msg = ("build_grader_state may not set `messages`: the grader's messages are its "
                   "grading request (prepare_messages_for_grader changes what it is shown)")
            raise ValueError(msg)
        declared = _schema_keys(self.state_schema).union(
            *(_schema_keys(m.state_schema) for m in self.middleware))
        if unknown := sorted(str(k) for k in built if k not in declared):
            name = getattr(self.state_schema, "__name__", "grader_state_schema")
            msg = (f"build_grader_state returned fields that {name} does not declare: "
                   f"{', '.join(unknown)} (declare them in grader_state_schema)")
            raise ValueError(msg)
        return dict(built)

    def runs(
        self, state: Mapping[str, Any], iteration: int, outer_runtime: Any,
        tools: Sequence[BaseTool], count: int,
    ) -> list[GraderRun | None]:
        """One `GraderRun` per repeat of a pass (None each when no hooks are configured).

        ``state`` is the agent's state with the messages the grader is shown; the fields are
        built once and each run starts from its own copy.
        """
        if not self.active:
            return [None] * count
        fields = self.fields(state, iteration)
        runtime = Runtime(
            context=coerce_context(self.context_schema, getattr(outer_runtime, "context", None)),
            store=getattr(outer_runtime, "store", None),
            stream_writer=getattr(outer_runtime, "stream_writer", None) or _no_writer,
        )
        return [GraderRun(self.middleware, dict(fields), runtime, tools) for _ in range(count)]


def _no_writer(_: Any) -> None:
    """A stream writer that drops what it is given (outside a graph run)."""


