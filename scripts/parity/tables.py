"""Which of deepagents' RubricMiddleware tests are left out, which differ on purpose, and why.

Also the constructor: which keyword parameters only ours takes (`API_OURS_ONLY`), checked
against the installed deepagents' ``RubricMiddleware.__init__``, so a parameter deepagents adds
is noticed. Every upstream test not named here must pass. ``plugin.py`` applies these tables and
``scripts/deepagents_parity.py`` checks every outcome against them and against the pinned
counts; the README's "Parity with deepagents' tests" says the same in prose. Names are
``Class::test`` and cover every parametrization.
"""

from __future__ import annotations

UPSTREAM = ("https://github.com/langchain-ai/deepagents",
            "libs/deepagents/tests/unit_tests/middleware/test_rubric_middleware.py",
            "23b83ad50f63d241d0069a3dc426d43b211adf2e")
"""Repository, path in it, and the commit these tables were written against."""
UPSTREAM_BLOB = "265c58b0ffb92fe56a78304b3375fa176663857b"
"""The git blob id of the upstream file at that commit (another version may differ)."""
IMPORTS = {
    "from deepagents.middleware.rubric import (\n": "from parity.shim import (\n",
    "from tests.unit_tests.chat_model import GenericFakeChatModel\n":
        "from parity.shim import GenericFakeChatModel\n",
}
"""Each upstream import line, and the line the copy that is run has instead."""

COPY_NAME = "test_rubric_middleware.py"
"""The name of the rewritten copy in the child pytest's temporary directory."""
REPORT_ENV = "RUBRIC_PARITY_REPORT"
"""When set, the path the outcome of every upstream test is written to, as JSON."""

PASSED = 25
"""Upstream tests (parametrizations counted) that pass against ours, as the README says."""
DIFFERING = 9
"""Upstream tests that fail where ours differs on purpose (run as strict xfail)."""
LEFT_OUT = 30
"""Upstream tests of private internals with no counterpart here (deselected)."""

_NO_TRANSCRIPT = ("calls _build_grader_transcript: ours renders no transcript; the grader sees "
                  "request, work and answer sections (tests/test_grader.py pins them, and "
                  "that a revision turn is never taken for the request)")
_THEIR_GRADER = ("patches their nested grader agent (create_agent with response_format, "
                 "_ensure_grader, _grader); ours binds the GraderResponse tool to the model "
                 "(grader.bind_grader)")
_THEIR_METADATA = ("their structured-output strategy diagnostics (_grader_trace_metadata, "
                   "ProviderStrategy/ToolStrategy): our grader always calls a tool")
_THEIR_PAYLOAD = ("_build_grader_payload with <rubric>/<transcript> blocks; ours has request, "
                  "criteria, work and answer blocks with the same per-call nonce and escaping "
                  "(tests/test_middleware.py, tests/test_grader.py)")

EXCLUDED: dict[str, str] = {
    "TestConstruction::test_defaults":
        "reads _model, _tools and the default _system_prompt text; ours keeps the spec in "
        "_model_spec and the prompt as None until a pass builds it",
    "TestConstruction::test_tools_default_to_empty": "reads _tools (ours: _grader_tools)",
    "TestConstruction::test_tools_propagated": "reads _tools (ours: _grader_tools)",
    "TestConstruction::test_custom_system_prompt_stored":
        "reads _system_prompt, which ours happens to share; what the grader is sent is "
        "pinned by tests/test_middleware.py::test_custom_system_prompt_replaces_builtin",
    "TestAfterAgentDirect::test_structured_output_error_reports_effective_strategy":
        "raises create_agent's StructuredOutputValidationError and reads "
        + _THEIR_METADATA,
    "TestGraderPlumbing::test_pure_llm_grader_constructed_lazily": _THEIR_GRADER,
    "TestGraderPlumbing::test_tools_passed_through": _THEIR_GRADER,
    "TestGraderPlumbing::test_model_propagated": _THEIR_GRADER,
    "TestGraderPlumbing::test_custom_system_prompt_honored": _THEIR_GRADER,
    "TestGraderPlumbing::test_grader_metadata_uses_langchain_fallback_models": _THEIR_METADATA,
    "TestGraderPlumbing::test_grader_metadata_strategy_is_unknown_without_langchain_fallback_models":
        _THEIR_METADATA,
    "TestGraderPlumbing::test_grader_metadata_strategy_is_unknown_without_langchain_factory":
        _THEIR_METADATA,
    "TestGraderPlumbing::test_grader_metadata_strategy_is_unknown_for_invalid_fallback_models":
        _THEIR_METADATA,
    "TestGraderPlumbing::test_grader_metadata_uses_model_profile_without_fallback_models":
        _THEIR_METADATA,
    "TestGraderPlumbing::test_grade_records_model_strategy_and_preserves_inherited_metadata":
        "drives their _grade through a stubbed _grader and reads " + _THEIR_METADATA,
    "TestGraderPlumbing::test_agrade_preserves_inherited_metadata":
        "drives their _agrade through a stubbed _grader and reads " + _THEIR_METADATA,
    "TestGraderPlumbing::test_grader_payload_isolates_rubric_from_transcript": _THEIR_PAYLOAD,
    "TestGraderPlumbing::test_grader_payload_nonce_changes_between_calls": _THEIR_PAYLOAD,
    "TestGraderPlumbing::test_grader_payload_neutralizes_rubric_breakout": _THEIR_PAYLOAD,
    "TestGraderPlumbing::test_grader_payload_neutralizes_transcript_breakout": _THEIR_PAYLOAD,
    "TestGraderPlumbing::test_sanitize_for_payload_is_case_insensitive":
        "calls _sanitize_for_payload; ours escapes only its own section tags, inside "
        "build_grader_messages",
    "TestGraderPlumbing::test_extract_graded_rejects_missing_response":
        "calls _extract_graded (reads their grader agent's structured_response)",
    "TestGraderPlumbing::test_extract_graded_accepts_dict":
        "calls _extract_graded (reads their grader agent's structured_response)",
    "TestTranscriptBuilder::test_renders_roles_and_tool_calls": _NO_TRANSCRIPT,
    "TestTranscriptBuilder::test_empty": _NO_TRANSCRIPT,
    "TestTranscriptSkipsSelfInjected::test_grader_feedback_is_not_treated_as_original_prompt":
        _NO_TRANSCRIPT,
}
"""Upstream tests of private internals with no rubric_core counterpart: not run."""

_COVERAGE = ("coverage: the stub answers 'satisfied' with no per-criterion verdicts; ours parses "
             "the criteria from the rubric and accepts a 'satisfied' only when every one is "
             "answered, so this pass is unverified and needs revision (README, 'How verdicts "
             "are checked'; deepagents 0.7.32 itself downgrades it too)")
_AT_THE_CAP = ("at the cap the evaluation's and end event's result stay the grader's own "
               "'needs_revision' and _rubric_status says max_iterations_reached, as the seed "
               "specifies (seed: 'Grader pass events'; README, 'The middleware')")
_ERROR_WORDING = ("grader_error explanation: ours is '<Type>: <message> (<facts>)' naming the "
                  "HTTP status, retries and the grader model; theirs adds configured_model=... "
                  "and effective_strategy=..., a structured-output notion ours has no "
                  "counterpart for (README, 'Parity with deepagents' tests')")

_REVISES = "During task with name 'model'"  # the agent had no reply left for our revision turn
_SATISFIED = "assert 'needs_revision' == 'satisfied'"
_CAPPED = "assert 'needs_revision' == 'max_iterations_reached'"

DIFFERS: dict[str, tuple[str, str]] = {
    "TestAfterAgentDirect::test_on_evaluation_callback_fires": (_COVERAGE, _SATISFIED),
    "TestAfterAgentDirect::test_stream_events_emitted": (_COVERAGE, _SATISFIED),
    "TestRubricTracking::test_sticky_rubric_across_invocations": (_COVERAGE, _REVISES),
    "TestRubricTracking::test_new_rubric_mints_new_grading_run_id": (_COVERAGE, _REVISES),
    "TestAfterAgentDirect::test_needs_revision_at_second_iteration_reports_cap":
        (_AT_THE_CAP, _CAPPED),
    "TestMaxIterationsObservability::test_info_log_emitted_when_cap_hits": (_AT_THE_CAP, _CAPPED),
    "TestMaxIterationsObservability::test_aafter_agent_reports_cap_on_all_surfaces":
        (_AT_THE_CAP, _CAPPED),
    "TestAfterAgentDirect::test_grader_exception_includes_http_status_code":
        (_ERROR_WORDING, "- Grader raised APIStatusError (HTTP 529) (configured_model="),
    "TestAfterAgentDirect::test_grader_exception_without_status_preserves_explanation":
        (_ERROR_WORDING,
         "assert \"configured_model='stub:test'\" in 'RuntimeError: grader exploded'"),
}
"""Upstream tests of public behaviour where ours differs on purpose: strict xfail, with the
failure text that shows the difference (`scripts/deepagents_parity.py` checks it is there)."""

API_OURS_ONLY: dict[str, str] = {
    "max_retries": "transient grader errors are retried with backoff (README, 'Transport errors')",
    "retry_backoff_s": "the first retry's delay",
    "grader_repeats": "k gradings per pass and their per-criterion consensus",
    "consensus": "majority or unanimous, for grader_repeats",
    "return_best": "the best attempt appended when the cap is reached",
    "force_tools": "every evidence tool called once, forced, for small models",
}
"""Constructor parameters deepagents' RubricMiddleware does not take, and what each is for.
Every parameter of theirs must be one of ours (`scripts/deepagents_parity.py --api-only`)."""
