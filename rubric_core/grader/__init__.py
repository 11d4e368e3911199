"""The grader: what it is sent, how its reply is read and checked, and one pass as steps.

- `prompt`: the grader's instructions, the section limits and the delimited transcript it is
  sent (`build_grader_messages`), and reading such a message back (`parse_grader_payload`);
- `transcript`: message text, revision turns, the latest attempt, `shorten`;
- `reply`: the verdict a reply carries (`verdict_args`) and the reply kept for the record;
- `criteria`: matching a verdict's criteria to the rubric's by name (`match_criteria`);
- `failure`: the facts a failed pass attaches to its exception (`grader_failure`);
- `steps`: one grading pass as a generator of steps (`grade_steps`) and the two tiny drivers
  that run it, `drive_sync` and `drive_async`.

Every name below is importable from ``rubric_core.grader`` as before the package was split;
``RETRY_AFTER_MAX_S``, ``retry_after_s`` and ``is_transient`` come from `rubric_core.http_retry`.
"""

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
from rubric_core.grader.prompt import (
    ANSWER_CHAR_LIMIT,
    GRADER_SYSTEM_PROMPT,
    REQUEST_CHAR_LIMIT,
    TOOL_OUTPUT_CHAR_LIMIT,
    WORK_MESSAGE_CHAR_LIMIT,
    GraderPayload,
    build_grader_messages,
    parse_grader_payload,
)
from rubric_core.grader.reply import VERDICT_TOOL, parse_text_verdict, raw_reply_text, verdict_args
from rubric_core.grader.steps import (
    MAX_TOOL_ROUNDS,
    CallModel,
    CallTool,
    GradeOutcome,
    Sleep,
    Step,
    bind_grader,
    drive_async,
    drive_sync,
    grade_steps,
)
from rubric_core.grader.transcript import (
    Attempt,
    is_revision_turn,
    latest_attempt,
    message_text,
    shorten,
)
from rubric_core.http_retry import RETRY_AFTER_MAX_S, is_transient, retry_after_s

__all__ = [
    "ANSWER_CHAR_LIMIT",
    "EXPLANATION_CHAR_LIMIT",
    "GAP_CHAR_LIMIT",
    "GRADER_SYSTEM_PROMPT",
    "MAX_TOOL_ROUNDS",
    "RAW_REPLY_CHAR_LIMIT",
    "REQUEST_CHAR_LIMIT",
    "RETRY_AFTER_MAX_S",
    "TOOL_OUTPUT_CHAR_LIMIT",
    "UNKNOWN_NAMES_LIMIT",
    "VERDICT_TOOL",
    "WORK_MESSAGE_CHAR_LIMIT",
    "Attempt",
    "CallModel",
    "CallTool",
    "CriteriaMatch",
    "GradeOutcome",
    "GraderFailure",
    "GraderOutputError",
    "GraderPayload",
    "Sleep",
    "Step",
    "assign_answers",
    "bind_grader",
    "build_grader_messages",
    "criterion_key",
    "drive_async",
    "drive_sync",
    "grade_steps",
    "grader_failure",
    "is_revision_turn",
    "is_transient",
    "latest_attempt",
    "match_criteria",
    "message_text",
    "model_label",
    "parse_grader_payload",
    "parse_text_verdict",
    "raw_reply_text",
    "retry_after_s",
    "shorten",
    "verdict_args",
]
