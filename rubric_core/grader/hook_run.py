"""One grader run through the grader middleware: its state, its runtime, its hooks per step.

A `GraderRun` (made by `rubric_core.grader.hooks.GraderHooks.runs`) is handed every step of a
pass by the drivers (`rubric_core.grader.steps`) and runs the hooks as ``create_agent`` orders
them: ``before_agent`` when the run starts and ``after_agent`` (last middleware first) when its
verdict is in; per model call ``before_model``, the ``wrap_model_call`` chain (first middleware
outermost), then ``after_model`` (last first), a retry after a transient error passing through
the chain again but not ``before_model``; per evidence tool call the ``wrap_tool_call`` chain.
Under ``ainvoke`` the ``a``-prefixed hooks run (a node hook with only a sync form runs in it; a
``wrap_*`` hook with only a sync form fails, as in ``create_agent``).

The pass decides every next call, so a hook's ``jump_to`` is followed only to ``"end"`` (the
run makes no further call: without a verdict the pass ends ``grader_error``), and a
``messages`` update lasts until the next model call, which starts from the pass's conversation.
A request's ``tools`` are the evidence tools and its ``response_format`` None: the verdict tool
is bound after the hooks, so no tool filter can drop it. A request no hook changed is sent as
the pass binds it (forcing, prompt-cache hints); a changed model, tools or ``tool_choice`` is
bound again (`rubric_core.grader.verdict.bind_call`) for that call.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from langchain.agents.middleware import (
    AgentMiddleware,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
)
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.graph.message import add_messages

from rubric_core.grader.steps import call_args, model_runnable
from rubric_core.grader.verdict import GraderBinding, bind_call, verdict_tool

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain.agents import AgentState
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig
    from langgraph.runtime import Runtime

    from rubric_core.grader.steps import CallModel, CallTool

logger = logging.getLogger(__name__)


class GraderRunEnded(Exception):
    """A grader hook ended the run (``jump_to="end"``) before the pass had its verdict."""


def _overrides(middleware: AgentMiddleware[Any, Any, Any], name: str) -> bool:
    """Whether ``middleware``'s class defines hook ``name`` (``create_agent``'s test)."""
    return getattr(type(middleware), name) is not getattr(AgentMiddleware, name)


def _reply(response: ModelResponse[Any]) -> AIMessage:
    reply = next((m for m in reversed(response.result) if isinstance(m, AIMessage)), None)
    if reply is None:
        msg = "the grader's wrap_model_call hooks returned a response without an AIMessage"
        raise TypeError(msg)
    return reply


@dataclasses.dataclass(frozen=True)
class _Built:
    """A model step's request as the pass made it, to tell what a hook changed."""

    model: Any
    tools: list[Any]
    tool_choice: Any


class GraderRun:
    """One grading run's state and runtime, and its hooks around each step (see the module)."""

    def __init__(self, middleware: Sequence[AgentMiddleware[Any, Any, Any]],
                 fields: dict[str, Any], runtime: Runtime[Any], tools: Sequence[BaseTool]
                 ) -> None:
        self.middleware = tuple(middleware)
        self.state: dict[str, Any] = {"messages": [], **fields}
        """The grader's state: what the hooks see and write."""
        self.runtime = runtime
        """The grader's runtime: the outer agent's context, store and stream writer."""
        self.tools = list(tools)
        self.ended_by: str | None = None
        """The middleware whose hook ended the run (``jump_to="end"``), if one did."""

    # ------------------------------------------------------------------ node hooks

    def _with(self, name: str) -> list[AgentMiddleware[Any, Any, Any]]:
        """The middleware with hook ``name`` in either form, in the order it runs."""
        found = [m for m in self.middleware if _overrides(m, name) or _overrides(m, f"a{name}")]
        return found[::-1] if name.startswith("after") else found

    def _apply(self, middleware: AgentMiddleware[Any, Any, Any], update: Any) -> None:
        """Write a hook's state update into the run's state (see the module for jumps)."""
        if update is None:
            return
        if not isinstance(update, Mapping):
            msg = (f"{middleware.name}'s grader hook must return a state update (a dict) or "
                   f"None, got {type(update).__name__}")
            raise TypeError(msg)
        for key, value in update.items():
            if key == "jump_to":
                if value == "end":
                    self.ended_by = self.ended_by or middleware.name
                elif value is not None:
                    logger.debug("grader hook %s asked to jump to %r: the pass decides the "
                                 "next call", middleware.name, value)
            elif key == "messages":
                self.state["messages"] = add_messages(
                    [m.model_copy() for m in self.state["messages"]], value)
            else:
                self.state[key] = value

    def _sync(self, middleware: AgentMiddleware[Any, Any, Any], name: str) -> Any:
        if not _overrides(middleware, name):
            msg = (f"{middleware.name} has only a{name}, and this grader call runs "
                   f"synchronously (invoke): give it {name} too, or run the agent with ainvoke")
            raise TypeError(msg)
        return getattr(middleware, name)

    def _run_nodes(self, name: str) -> None:
        for m in self._with(name):
            self._apply(m, self._sync(m, name)(dict(self.state), self.runtime))

    async def _arun_nodes(self, name: str) -> None:
        for m in self._with(name):
            if _overrides(m, f"a{name}"):
                update = await getattr(m, f"a{name}")(dict(self.state), self.runtime)
            else:  # as create_agent does: a node hook with only a sync form runs in it
                update = getattr(m, name)(dict(self.state), self.runtime)
            self._apply(m, update)

    def before_agent(self) -> None:
        """Run the ``before_agent`` hooks (the run's start)."""
        self._run_nodes("before_agent")

    async def abefore_agent(self) -> None:
        """Run the ``abefore_agent`` hooks (a sync-only one in its sync form)."""
        await self._arun_nodes("before_agent")

    def after_agent(self) -> None:
        """Run the ``after_agent`` hooks (the verdict is in)."""
        self._run_nodes("after_agent")

    async def aafter_agent(self) -> None:
        """Run the ``aafter_agent`` hooks."""
        await self._arun_nodes("after_agent")

    # ------------------------------------------------------------------ model calls

    def _check_open(self) -> None:
        if self.ended_by is not None:
            msg = (f"grader middleware {self.ended_by} ended the grader's run (jump_to='end') "
                   "before it gave a verdict")
            raise GraderRunEnded(msg)

    def _enter_call(self, step: CallModel) -> SystemMessage | None:
        """Set the state's messages to this call's; the system message goes to the request."""
        self._check_open()
        messages = list(step.messages)
        first = messages[0] if messages else None
        system = first if isinstance(first, SystemMessage) else None
        self.state["messages"] = messages[1:] if system is not None else messages
        return system

    def _request(self, step: CallModel, bound: Any, system: SystemMessage | None
                 ) -> tuple[ModelRequest[Any], _Built]:
        self._check_open()
        binding = bound if isinstance(bound, GraderBinding) else None
        built = _Built(model=binding.model if binding else bound,
                       tools=list(binding.tools) if binding else [],
                       tool_choice=step.force if step.mode == "tool_choice" else None)
        request: ModelRequest[Any] = ModelRequest(
            model=built.model, messages=list(self.state["messages"]), system_message=system,
            tool_choice=built.tool_choice, tools=list(built.tools), response_format=None,
            state=cast("AgentState[Any]", dict(self.state)), runtime=self.runtime,
            model_settings={})
        return request, built

    def _send(self, request: ModelRequest[Any], built: _Built, step: CallModel, bound: Any,
              config: RunnableConfig | None) -> tuple[Any, list[BaseMessage], Any, dict[str, Any]]:
        """What the innermost handler sends: the runnable, messages, config and options."""
        unchanged = (request.model is built.model and request.tool_choice == built.tool_choice
                     and len(request.tools) == len(built.tools)
                     and all(a is b for a, b in zip(request.tools, built.tools, strict=True)))
        runnable = model_runnable(bound, step) if unchanged else _rebound(request, built, step,
                                                                           bound)
        if request.model_settings:
            runnable = runnable.bind(**request.model_settings)
        messages = [*([request.system_message] if request.system_message else []),
                    *request.messages]
        return runnable, *call_args(runnable, messages, config, step)

    def _response(self, middleware: AgentMiddleware[Any, Any, Any], result: Any
                  ) -> ModelResponse[Any]:
        """A ``wrap_model_call`` hook's result as a response (its Command's update applied)."""
        if isinstance(result, AIMessage):
            return ModelResponse(result=[result])
        if isinstance(result, ExtendedModelResponse):
            if result.command is not None and isinstance(result.command.update, Mapping):
                self._apply(middleware, result.command.update)
            return result.model_response
        if isinstance(result, ModelResponse):
            return result
        msg = (f"{middleware.name}'s wrap_model_call hook must return a ModelResponse or an "
               f"AIMessage, got {type(result).__name__}")
        raise TypeError(msg)

    def _after_reply(self, reply: AIMessage) -> None:
        self.state["messages"] = [*self.state["messages"], reply]

    def call_model(self, step: CallModel, bound: Any, config: RunnableConfig | None
                   ) -> AIMessage:
        """One model step through ``before_model``, ``wrap_model_call`` and ``after_model``."""
        system = self._enter_call(step)
        if step.attempt == 0:
            self._run_nodes("before_model")
        request, built = self._request(step, bound, system)

        def base(req: ModelRequest[Any]) -> ModelResponse[Any]:
            runnable, messages, call_config, options = self._send(req, built, step, bound,
                                                                  config)
            return ModelResponse(result=[runnable.invoke(messages, call_config, **options)])

        wrappers = self._with("wrap_model_call")

        def chain(i: int, req: ModelRequest[Any]) -> ModelResponse[Any]:
            if i == len(wrappers):
                return base(req)
            hook = wrappers[i]
            return self._response(hook, hook.wrap_model_call(req, lambda r: chain(i + 1, r)))

        reply = _reply(chain(0, request))
        self._after_reply(reply)
        self._run_nodes("after_model")
        return reply

    async def acall_model(self, step: CallModel, bound: Any, config: RunnableConfig | None
                          ) -> AIMessage:
        """`call_model` under ``ainvoke``: the async hooks, the call awaited."""
        system = self._enter_call(step)
        if step.attempt == 0:
            await self._arun_nodes("before_model")
        request, built = self._request(step, bound, system)

        async def base(req: ModelRequest[Any]) -> ModelResponse[Any]:
            runnable, messages, call_config, options = self._send(req, built, step, bound,
                                                                  config)
            return ModelResponse(result=[await runnable.ainvoke(messages, call_config,
                                                                **options)])

        wrappers = self._with("wrap_model_call")

        async def chain(i: int, req: ModelRequest[Any]) -> ModelResponse[Any]:
            if i == len(wrappers):
                return await base(req)
            hook = wrappers[i]
            return self._response(hook,
                                  await hook.awrap_model_call(req, lambda r: chain(i + 1, r)))

        reply = _reply(await chain(0, request))
        self._after_reply(reply)
        await self._arun_nodes("after_model")
        return reply

    # ------------------------------------------------------------------ tool calls

    def _tool_request(self, step: CallTool, config: RunnableConfig | None) -> ToolCallRequest:
        self._check_open()
        state = dict(self.state)
        call: Any = {**step.call, "type": "tool_call"}
        runtime = ToolRuntime(
            state=state, context=self.runtime.context, config=config or {},
            stream_writer=self.runtime.stream_writer, tool_call_id=call.get("id"),
            store=self.runtime.store, tools=list(self.tools))
        return ToolCallRequest(tool_call=call, tool=step.tool, state=state, runtime=runtime)

    def call_tool(self, step: CallTool, config: RunnableConfig | None) -> ToolMessage:
        """One evidence tool call through the ``wrap_tool_call`` chain."""
        wrappers = self._with("wrap_tool_call")

        def chain(i: int, req: ToolCallRequest) -> Any:
            if i == len(wrappers):
                return (req.tool or step.tool).invoke(dict(req.tool_call), config)
            return _tool_message(wrappers[i].wrap_tool_call(req, lambda r: chain(i + 1, r)))

        return _tool_message(chain(0, self._tool_request(step, config)))

    async def acall_tool(self, step: CallTool, config: RunnableConfig | None) -> ToolMessage:
        """`call_tool` under ``ainvoke`` (``awrap_tool_call``)."""
        wrappers = self._with("wrap_tool_call")

        async def chain(i: int, req: ToolCallRequest) -> Any:
            if i == len(wrappers):
                return await (req.tool or step.tool).ainvoke(dict(req.tool_call), config)
            return _tool_message(
                await wrappers[i].awrap_tool_call(req, lambda r: chain(i + 1, r)))

        return _tool_message(await chain(0, self._tool_request(step, config)))


def _tool_message(result: Any) -> ToolMessage:
    if isinstance(result, ToolMessage):
        return result
    msg = ("a grader wrap_tool_call hook must return a ToolMessage, got "
           f"{type(result).__name__} (the grader's run applies no Command)")
    raise TypeError(msg)


def _rebound(request: ModelRequest[Any], built: _Built, step: CallModel, bound: Any) -> Any:
    """The runnable for a request a hook changed: the pass's binding, on what it now holds."""
    force = step.force if request.tool_choice == built.tool_choice else request.tool_choice
    tools: list[BaseTool] = []
    for tool in request.tools:
        if not isinstance(tool, BaseTool):
            msg = ("a grader wrap_model_call hook added a tool that is not a LangChain tool "
                   f"({type(tool).__name__}); the grader binds LangChain tools only")
            raise TypeError(msg)
        tools.append(tool)
    if isinstance(bound, GraderBinding):
        verdict = verdict_tool(bound.criteria, request.model)
        return bind_call(request.model, tools, verdict, force, step.mode)
    return request.model.bind_tools(tools, tool_choice=force) if tools else request.model

