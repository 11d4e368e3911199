"""The middleware's agent state: LangChain's ``AgentState`` with the rubric and bookkeeping.

Kept apart from `rubric_core.types` (the shared vocabulary, which this module imports) because
``AgentState`` lives in LangChain's agents package, whose import builds the whole agent
factory: the store, the settings and the shared vocabulary load without it.
"""

from __future__ import annotations

from typing import Annotated, NotRequired

from langchain.agents.middleware.types import AgentState, PrivateStateAttr

# At run time, not only for type checkers: LangGraph resolves the state's annotations.
from rubric_core.types import RubricEvaluation, RubricStatus  # noqa: TC001


class RubricState(AgentState):
    """Agent state extended with the rubric and the middleware's bookkeeping.

    Only `rubric` is part of the input/output schema; the rest is private but readable with
    `agent.get_state(config).values` on a checkpointed thread.
    """

    rubric: NotRequired[str | None]
    """The caller's rubric: one criterion per line or bullet."""
    _rubric_status: NotRequired[Annotated[RubricStatus | None, PrivateStateAttr]]
    """Status of the current grading run; `None` until its first pass ends."""
    _rubric_iterations: NotRequired[Annotated[int, PrivateStateAttr]]
    """Grader passes completed in the current grading run."""
    _rubric_evaluations: NotRequired[Annotated[list[RubricEvaluation], PrivateStateAttr]]
    """Every evaluation on this thread, in order."""
    _current_grading_run_id: NotRequired[Annotated[str | None, PrivateStateAttr]]
    """The grading run in force."""
    _active_rubric: NotRequired[Annotated[str | None, PrivateStateAttr]]
    """The rubric text that started the current grading run."""
    _rubric_best_iteration: NotRequired[Annotated[int | None, PrivateStateAttr]]
    """0-based pass of the current grading run whose answer passed the most criteria (ties go
    to the later pass); updated every pass, `None` until the run's first pass ends."""


__all__ = ["RubricState"]
