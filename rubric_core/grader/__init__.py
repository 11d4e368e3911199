"""The grader: what it is sent, how its reply is read and checked, and one pass as steps.

- `prompt`: the grader's instructions, the section limits and the delimited transcript it is
  sent (`build_grader_messages`: a stable start, the untrusted attempt last), and reading such
  a message back (`parse_grader_payload`, `split_grader_message`);
- `cache`: the provider prompt-cache hints the drivers add to each grader call (`cache_hints`);
- `transcript`: message text, revision turns, the latest attempt, `shorten`;
- `reply`: the verdict a reply carries (`verdict_args`), whether it obeyed a forced call
  (`forced_reply`) or was cut at its output limit (`was_cut`), and the reply kept for the
  record;
- `verdict`: the verdict tool built per rubric (`verdict_schema`, `verdict_tool`) and how a
  model is made to call it (`GraderBinding`, `bind_grader`, the `VerdictMode` ladder);
- `criteria`: matching a verdict's criteria to the rubric's by name (`match_criteria`);
- `failure`: the facts a failed pass attaches to its exception (`grader_failure`);
- `steps`: one grading pass as a generator of steps (`grade_steps`) and the two tiny drivers
  that run it, `drive_sync` and `drive_async`;
- `hooks`: the grader middleware run around each step of a pass (`GraderHooks`, `GraderRun`).

Every name below is importable from ``rubric_core.grader`` as before the package was split;
``RETRY_AFTER_MAX_S``, ``retry_after_s`` and ``is_transient`` come from `rubric_core.http_retry`.
"""

from rubric_core.grader.cache import cache_hints
from rubric_core.grader.criteria import (
    EXPLANATION_CHAR_LIMIT,
    GAP_CHAR_LIMIT,
    UNKNOWN_NAMES_LIMIT,
    CriteriaMatch,
    assign_answers,
    criterion_key,
    match_criteria,
)
from rubric_core.grader.failure import (
    RAW_REPLY_CHAR_LIMIT,
    GraderFailure,
    GraderOutputError,
    grader_failure,
    model_label,
)
from rubric_core.grader.hook_run import GraderRun, GraderRunEnded
from rubric_core.grader.hooks import GraderHooks, coerce_context
from rubric_core.grader.prompt import (
    ANSWER_CHAR_LIMIT,
    GRADER_SYSTEM_PROMPT,
    REQUEST_CHAR_LIMIT,
    TOOL_OUTPUT_CHAR_LIMIT,
    WORK_MESSAGE_CHAR_LIMIT,
    GraderMessageSplit,
    GraderPayload,
    build_grader_messages,
    grader_system_prompt,
    parse_grader_payload,
    split_grader_message,
)
from rubric_core.grader.reply import (
    CUT_FINISH_REASONS,
    VERDICT_TOOL,
    forced_reply,
    keyed_verdict,
    parse_text_verdict,
    raw_reply_text,
    verdict_args,
    was_cut,
)
from rubric_core.grader.steps import (
    MAX_TOOL_ROUNDS,
    CallModel,
    CallTool,
    GradeOutcome,
    Sleep,
    Step,
    drive_async,
    drive_sync,
    grade_steps,
    refused,
)
from rubric_core.grader.transcript import (
    Attempt,
    is_revision_turn,
    latest_attempt,
    message_text,
    prepared_transcript,
    shorten,
)
from rubric_core.grader.verdict import (
    VERDICT_MODES,
    GraderBinding,
    VerdictMode,
    bind_grader,
    verdict_modes,
    verdict_schema,
    verdict_tool,
)
from rubric_core.http_retry import RETRY_AFTER_MAX_S, is_transient, retry_after_s

__all__ = [
    "ANSWER_CHAR_LIMIT",
    "CUT_FINISH_REASONS",
    "EXPLANATION_CHAR_LIMIT",
    "GAP_CHAR_LIMIT",
    "GRADER_SYSTEM_PROMPT",
    "MAX_TOOL_ROUNDS",
    "RAW_REPLY_CHAR_LIMIT",
    "REQUEST_CHAR_LIMIT",
    "RETRY_AFTER_MAX_S",
    "TOOL_OUTPUT_CHAR_LIMIT",
    "UNKNOWN_NAMES_LIMIT",
    "VERDICT_MODES",
    "VERDICT_TOOL",
    "WORK_MESSAGE_CHAR_LIMIT",
    "Attempt",
    "CallModel",
    "CallTool",
    "CriteriaMatch",
    "GradeOutcome",
    "GraderBinding",
    "GraderFailure",
    "GraderHooks",
    "GraderMessageSplit",
    "GraderOutputError",
    "GraderPayload",
    "GraderRun",
    "GraderRunEnded",
    "Sleep",
    "Step",
    "VerdictMode",
    "assign_answers",
    "bind_grader",
    "build_grader_messages",
    "cache_hints",
    "coerce_context",
    "criterion_key",
    "drive_async",
    "drive_sync",
    "forced_reply",
    "grade_steps",
    "grader_failure",
    "grader_system_prompt",
    "is_revision_turn",
    "is_transient",
    "keyed_verdict",
    "latest_attempt",
    "match_criteria",
    "message_text",
    "model_label",
    "parse_grader_payload",
    "parse_text_verdict",
    "prepared_transcript",
    "raw_reply_text",
    "refused",
    "retry_after_s",
    "shorten",
    "split_grader_message",
    "verdict_args",
    "verdict_modes",
    "verdict_schema",
    "verdict_tool",
    "was_cut",
]
