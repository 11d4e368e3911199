"""The verdict tool of one rubric, and how a grader model is made to call it.

The schema (`verdict_schema`) is built per rubric, so that a model whose output is
constrained to it answers every criterion, by its exact name, with a boolean:

- ``criteria`` has one required property per criterion, named by the criterion's text, each
  ``{"passed": boolean, "gap": string}`` (both required, nothing else allowed); then
  ``explanation`` (a string) and ``result`` (``satisfied``, ``needs_revision`` or
  ``rubric_cannot_be_judged``, read as ``failed``: a small model picked a bare ``failed`` for
  half of SmolLM2's verdicts, ending runs that could be judged). Such a verdict's result
  follows from its criteria; only ``failed`` is taken from the model
  (`rubric_core.grader.reply.verdict_args`).
- *Listed* instead, for providers whose tool schemas restrict property names (Anthropic:
  ``^[a-zA-Z0-9_.-]{1,64}$``; Google's function declarations) and for a rubric with two
  criteria of one name: ``criteria`` is a list of exactly as many ``{name, passed, gap}`` as
  there are criteria, ``name`` an enum of the criteria's texts; the pass's coverage retry
  catches a repeated name.
- *Bounded* for OpenAI-compatible servers other than OpenAI's own (local models, whose servers
  turn the schema into a grammar): the explanation and each gap carry a ``maxLength``, so a
  small model cannot spend its output limit inside one string (SmolLM2 counted "1, 2, 3, …"
  in its gaps), and a criterion is either ``{"passed": true, "gap": ""}`` or
  ``{"passed": false, "gap": <1 to GAP_MAX_CHARS characters>}``: a failure always says why.

How the call is forced (`VerdictMode`), tried in this order for a model and kept for its next
passes (`GradeOutcome.mode`); a mode is left when the server refuses it (HTTP 4xx, or a 5xx
that names the parameter) or ignores it (the reply does not call the tool):

- ``tool_choice``: the verdict tool is bound with the evidence tools and named in
  ``tool_choice`` (for OpenAI's own API also ``strict``, its Structured Outputs);
- ``json_schema``: OpenAI-compatible servers only: no tools, ``response_format`` of type
  ``json_schema`` with the same schema; the JSON reply is read as the call;
- ``prompt``: tools bound, nothing forced; the prompt asks for the call, and the pass's one
  format correction and coverage retry do the rest (how every grader was called before).

What is used per provider, and what has been verified (the README's "Use your own model
server" says the same for each server):

============================  ==========================================  =================
provider                      constraint                                  verified
============================  ==========================================  =================
OpenAI (api.openai.com)       ``tool_choice`` + ``strict`` (keyed)        request shape only
Anthropic                     ``tool_choice`` (listed; not enforced)      request shape only
llama.cpp ``llama-server``    ``json_schema`` → grammar (bounded): it     tests, bench
                              ignores tools for templates without them
                              (``GET /props`` says so: started there)
llama.cpp Python server       ``tool_choice`` → grammar (bounded)         tests, bench
vLLM                          ``tool_choice`` → guided decoding           not here
Ollama (``/v1``)              ``json_schema`` → ``format`` grammar        not here
============================  ==========================================  =================
"""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.request
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from langchain_core.utils.function_calling import convert_to_openai_tool

from rubric_core.endpoint import class_names, is_openai_compatible, is_openai_own
from rubric_core.grader.cache import chat_model
from rubric_core.grader.criteria import criterion_key
from rubric_core.grader.reply import CANNOT_JUDGE, VERDICT_TOOL

if TYPE_CHECKING:
    from collections.abc import Sequence

    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool

VerdictMode: TypeAlias = Literal["tool_choice", "json_schema", "prompt"]
"""How a grader call is made to call a tool (see the module text)."""

VERDICT_MODES: tuple[VerdictMode, ...] = ("tool_choice", "json_schema", "prompt")
"""Every mode, in the order they are tried."""

EXPLANATION_MAX_CHARS = 160
"""A bounded verdict's explanation is at most this long (local servers: a grammar bound)."""
GAP_MAX_CHARS = 120
"""A bounded verdict's gaps are at most this long."""
GAP_PATTERN = rf'^[^ "\\\n\r\t][^"\\\n\r\t]{{0,{GAP_MAX_CHARS - 1}}}$'
"""A bounded failing gap: one line of 1 to `GAP_MAX_CHARS` characters, not starting blank
(SmolLM2 filled a required gap with newlines), without quotes, backslashes or tabs (a grammar
built from the pattern puts characters into the JSON string as they are: a tab there was
invalid JSON)."""
TOOL_ARG_MAX_CHARS = 4_000
"""A bounded evidence tool's text arguments are at most this long, where the tool sets no
bound of its own (SmolLM2 repeated one sentence into a text argument until its output limit
cut the call); room for the code of a function and its tests."""

_LISTED_PROVIDERS = frozenset({"ChatAnthropic", "ChatAnthropicVertex", "ChatGoogleGenerativeAI",
                               "ChatVertexAI"})

_DESCRIPTION = (
    "Give your verdict: every criterion by its exact text with passed (true or false) and gap "
    "(what is missing or wrong when it fails; empty when it passes), a one-sentence "
    "explanation, and the result ('rubric_cannot_be_judged' only when the rubric cannot be "
    "judged against this request).")


def _target(model: Any) -> Any:
    """The model that gives the verdict: a hybrid grader's LLM, else the model itself."""
    model = chat_model(model)
    inner = getattr(model, "llm", None)
    return inner if inner is not None and hasattr(model, "with_llm_binding") else model


def verdict_modes(model: Any) -> tuple[VerdictMode, ...]:
    """The modes a grader model is tried in, in order (``json_schema``: compatible servers).

    A server that says its chat template takes no tools (`server_takes_tools`) starts at
    ``json_schema``: asked with ``tool_choice`` it would answer a whole reply of prose first.
    """
    target = _target(model)
    if not is_openai_compatible(target):
        return ("tool_choice", "prompt")
    if server_takes_tools(target) is False:
        return ("json_schema", "prompt")
    return VERDICT_MODES


PROPS_TIMEOUT_S = 2.0
"""How long `server_takes_tools` waits for a server's answer."""

_takes_tools: dict[str, bool | None] = {}
_takes_tools_lock = threading.Lock()


def server_takes_tools(model: Any) -> bool | None:
    """Whether an OpenAI-compatible server's chat template takes tools; None: not said.

    llama.cpp's ``llama-server`` says so at ``GET /props`` (``chat_template_caps``), and
    ignores the tools of a request when its template takes none (SmolLM2's). Asked once per
    base URL and process (with the model's own key, which is for that server); any other
    server, or an error, is None.
    """
    base = str(getattr(model, "openai_api_base", None) or "").rstrip("/")
    if not base:
        return None
    with _takes_tools_lock:
        if base in _takes_tools:
            return _takes_tools[base]
    root = base.removesuffix("/v1")
    key: Any = getattr(model, "openai_api_key", None)
    secret = key.get_secret_value() if hasattr(key, "get_secret_value") else None
    request = urllib.request.Request(f"{root}/props", headers={
        "Authorization": f"Bearer {secret}"} if secret else {})
    answer: bool | None = None
    try:
        with urllib.request.urlopen(request, timeout=PROPS_TIMEOUT_S) as reply:
            caps = json.loads(reply.read(1_000_000)).get("chat_template_caps") or {}
        if isinstance(caps.get("supports_tools"), bool):
            answer = caps["supports_tools"]
    except (OSError, ValueError, AttributeError):
        answer = None  # not llama-server, or it did not say
    with _takes_tools_lock:
        _takes_tools[base] = answer
    return answer


def verdict_schema(criteria: Sequence[str], *, listed: bool = False,
                   bounded: bool = False) -> dict[str, Any]:
    """The JSON Schema of one rubric's verdict arguments (see the module text).

    Args:
        criteria: The rubric's criteria, in order.
        listed: Criteria as a list with an enum of names, not one property each.
        bounded: Explanation and gaps with a ``maxLength``.

    """
    def text(limit: int) -> dict[str, Any]:
        return {"type": "string", "maxLength": limit} if bounded else {"type": "string"}

    listed = listed or len({criterion_key(c) for c in criteria}) < len(criteria)
    verdict = {"passed": {"type": "boolean"}, "gap": text(GAP_MAX_CHARS)}
    if listed:
        names = list(dict.fromkeys(criteria))
        item = {"type": "object", "properties": {"name": {"type": "string", "enum": names},
                                                 **verdict},
                "required": ["name", "passed", "gap"], "additionalProperties": False}
        graded: dict[str, Any] = {"type": "array", "items": item, "minItems": len(criteria),
                                  "maxItems": len(criteria)}
    else:
        one: dict[str, Any] = {"type": "object", "properties": verdict,
                               "required": ["passed", "gap"], "additionalProperties": False}
        if bounded:  # a grammar: a pass has an empty gap, a failure one that says something
            one = {"anyOf": [_one(True, {"type": "string", "maxLength": 0}),
                             _one(False, {"type": "string", "pattern": GAP_PATTERN})]}
        graded = {"type": "object", "properties": {c: one for c in criteria},
                  "required": list(criteria), "additionalProperties": False}
    return {
        "type": "object",
        "properties": {
            "criteria": graded,
            "explanation": text(EXPLANATION_MAX_CHARS),
            "result": {"type": "string", "enum": ["satisfied", "needs_revision", CANNOT_JUDGE]},
        },
        "required": ["criteria", "explanation", "result"],
        "additionalProperties": False,
    }


def _one(passed: bool, gap: dict[str, Any]) -> dict[str, Any]:
    """One criterion's verdict when it passes (``passed=True``) or fails, with its gap."""
    return {"type": "object", "properties": {"passed": {"type": "boolean", "const": passed},
                                             "gap": gap},
            "required": ["passed", "gap"], "additionalProperties": False}


def verdict_tool(criteria: Sequence[str], model: Any = None) -> dict[str, Any]:
    """The ``GraderResponse`` tool (OpenAI's function format) of one rubric, for ``model``."""
    target = _target(model) if model is not None else None
    names = class_names(target) if target is not None else set()
    schema = verdict_schema(criteria, listed=bool(names & _LISTED_PROVIDERS),
                            bounded=is_openai_compatible(target))
    function: dict[str, Any] = {"name": VERDICT_TOOL, "description": _DESCRIPTION,
                                "parameters": schema}
    if is_openai_own(target):
        function["strict"] = True
    return {"type": "function", "function": function}


def tool_parameters(tool: Any, *, bounded: bool = False) -> dict[str, Any]:
    """A tool's argument schema in OpenAI's function format.

    ``bounded``: its text arguments at most `TOOL_ARG_MAX_CHARS` long, where they have no
    bound of their own.
    """
    parameters: dict[str, Any] = convert_to_openai_tool(tool)["function"].get("parameters") or {}
    if not bounded:
        return parameters
    properties = {
        name: ({**sub, "maxLength": TOOL_ARG_MAX_CHARS}
               if sub.get("type") == "string" and not {"maxLength", "enum", "pattern"} & set(sub)
               else sub)
        for name, sub in (parameters.get("properties") or {}).items()}
    return {**parameters, "properties": properties}


def _sent_tool(tool: BaseTool, bounded: bool) -> Any:
    """An evidence tool as it is bound: itself, or for a grammar its text arguments bounded."""
    if not bounded:
        return tool
    function = convert_to_openai_tool(tool)["function"]
    return {"type": "function", "function": {**function,
                                             "parameters": tool_parameters(tool, bounded=True)}}


def bind_call(model: Any, tools: Sequence[BaseTool], verdict: dict[str, Any],
              force: str | None, mode: VerdictMode) -> Any:
    """``model`` ready for one grader call: evidence tools and verdict, ``force`` forced.

    Args:
        model: The grader chat model.
        tools: The evidence tools.
        verdict: The verdict tool (`verdict_tool`).
        force: The tool the call must call (the verdict or an evidence tool); None: free.
        mode: How it is forced (ignored when ``force`` is None, and in ``prompt`` mode).

    """
    if hasattr(model, "with_llm_binding"):  # a hybrid grader: its LLM is bound the same way,
        def bind_llm(llm: Any, criteria: Sequence[str]) -> Any:  # for what rules cannot check
            return bind_call(llm, tools, verdict_tool(criteria, llm), force, mode)
        return model.with_llm_binding(tools, bind_llm)
    bounded = is_openai_compatible(model)
    sent = [_sent_tool(t, bounded) for t in tools]
    if force is None or mode == "prompt":
        return model.bind_tools([*sent, verdict])
    if mode == "tool_choice":
        return model.bind_tools([*sent, verdict], tool_choice=force)
    schema = (verdict["function"]["parameters"] if force == VERDICT_TOOL
              else tool_parameters(next(t for t in tools if t.name == force), bounded=bounded))
    response_format = {"type": "json_schema",
                       "json_schema": {"name": force, "schema": schema, "strict": True}}
    # In extra_body, not response_format: langchain-openai would take its structured-output
    # path (the SDK's parse helpers, which raise on a reply cut at max_tokens).
    extra = {**(getattr(model, "extra_body", None) or {}), "response_format": response_format}
    return model.bind(extra_body=extra)


@dataclasses.dataclass
class GraderBinding:
    """A grader model, its evidence tools and one rubric's verdict tool, bound per call.

    The drivers (`rubric_core.grader.steps.drive_sync`, `drive_async`) ask it for the runnable
    of each step (`runnable`); the bindings are made once each.
    """

    model: BaseChatModel
    """The grader chat model."""
    tools: list[BaseTool]
    """Its evidence tools."""
    criteria: list[str]
    """The rubric's criteria."""
    _bound: dict[tuple[str | None, VerdictMode], Any] = dataclasses.field(
        default_factory=dict, repr=False)

    @property
    def modes(self) -> tuple[VerdictMode, ...]:
        """The modes this model is tried in (`verdict_modes`)."""
        return verdict_modes(self.model)

    def ladder(self, start: VerdictMode | None) -> tuple[VerdictMode, ...]:
        """The modes from ``start`` on (all of them when ``start`` is None or not one)."""
        modes = self.modes
        return modes[modes.index(start):] if start in modes else modes

    def runnable(self, force: str | None, mode: VerdictMode) -> Any:
        """The model bound for a call that must call ``force`` (None: free) in ``mode``."""
        key = (force, mode)
        if key not in self._bound:
            verdict = verdict_tool(self.criteria, self.model)
            self._bound[key] = bind_call(self.model, self.tools, verdict, force, mode)
        return self._bound[key]


def bind_grader(model: BaseChatModel, tools: Sequence[BaseTool],
                criteria: Sequence[str] | None = None) -> Any:
    """The grader model with the evidence tools and this rubric's verdict tool.

    Returns:
        A `GraderBinding` for ``criteria``; without criteria, the model bound to the tools and
        the generic ``GraderResponse`` schema, never forced (how graders were bound before
        verdict schemas were built per rubric).

    """
    if criteria is None:
        from rubric_core.types import GraderResponse

        return model.bind_tools([*tools, GraderResponse])
    return GraderBinding(model, list(tools), list(criteria))
