"""Run: start the rubric loop and watch it live; resume interrupted runs; the last result."""

from __future__ import annotations

import html
from contextlib import closing

import streamlit as st

from pages._calls_view import draw_calls
from rubric_core import app_support as sup
from rubric_core import redact, session
from rubric_core.models import ModelConfigError
from rubric_core.rubric import parse_criteria
from rubric_core.store import StoreError

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/run.py"
    st.switch_page("app.py")
store = state.get("store")
secrets = sup.safe_mapping(st.secrets)
form = sup.settings_from_state(state)
key = sup.session_key(state)
token_delay_s, grader_pause_s = sup.demo_pacing(sup.env_token_delay(), state.get("pace_demo"),
                                                state.get("token_delay_s"))
models = sup.app_models(secrets, session_key=key, sidebar_base_url=form.base_url,
                        token_delay_s=token_delay_s, grader_pause_s=grader_pause_s)


# Long criteria and gaps get the room, and their full text on hover (help).
VERDICT_COLUMNS = {
    "criterion": st.column_config.TextColumn("Criterion", width="medium"),
    "passed": st.column_config.CheckboxColumn("Passed", width="small"),
    "gap": st.column_config.TextColumn("Gap", width="large",
                                       help="What the grader found missing or wrong"),
    "note": st.column_config.TextColumn(
        "Note", width="medium",
        help="regressed: passed on the previous pass, fails now; with grader repeats, how many "
        "agreed (unstable when they did not all agree)"),
}


def request_resume(run_id: str) -> None:
    # Bound to the run the picker showed when it was drawn, not to whatever it lists next;
    # the endpoint and models typed for it go along (the key stays in this session's memory).
    state["resume_request"] = run_id
    state["resume_changes"] = sup.resume_changes(state, run_id)


def show_result(run_id: str) -> None:
    record = store.get_run(run_id)
    if record is None:
        return
    evaluations = store.evaluations(run_id)
    status = session.run_status(record)
    advice = sup.next_steps(status, error=record.error, grader_model=record.grader_model,
                            resumable=session.is_resumable(record))
    with st.container(key="final_status", border=True):
        getattr(st, advice.level)(advice.headline)
        for step in advice.steps:
            st.markdown(f"- {step}")
        if evaluations and status != "satisfied":
            st.caption(f"Grader's last explanation: {evaluations[-1]['explanation']}")
        cols = st.columns(4)
        cols[0].metric("Status", status)
        cols[1].metric("Grader passes", record.iterations)
        cols[2].metric("Duration", f"{record.duration_s or 0:.1f} s")
        cols[3].metric("Run id", record.run_id[:8])
        if caption := sup.tokens_caption(record):
            st.caption(caption)
        cost = sup.run_cost_of(store, sup.session_prices(state).prices, record)
        st.caption(sup.cost_caption(cost))
        if cost.passes:
            st.dataframe(sup.pass_costs_frame(cost), hide_index=True, key="run_pass_costs")
    for i, answer in enumerate(sup.shown_answers(evaluations)):
        with st.container(key=f"final_answer_{i}", border=i > 0):
            st.markdown(sup.answer_heading(answer, first=i == 0))
            st.markdown(sup.answer_markdown(answer.text))
    with st.expander("Calls: every model call of this run"):
        draw_calls(store, run_id, key="run")


def live(run: session.Session) -> None:
    state["last_run_id"] = run.run_id  # a stop reruns the page: show this run's state then
    cap = run.settings.max_iterations
    bar = st.progress(0.0, text="Starting…")
    # What the run has spent so far, redrawn as each model call ends (the same prices as the
    # result below; a resumed run starts from what it recorded before).
    cost_slot = st.empty()
    spent = sup.running_cost(store, sup.session_prices(state).prices, run.run_id, run.settings)
    cost_slot.caption(sup.live_cost_caption(spent))
    box = st.status("Running the rubric loop…", expanded=True)
    answer, slot, pass_slot = "", None, None
    with closing(run) as stream:
        for event in stream:
            kind = event["type"]
            if kind == "call_finished":
                sup.add_call(spent, run.run_id, event["call"])
                cost_slot.caption(sup.live_cost_caption(spent))
            elif kind == "worker_started":
                bar.progress(*sup.progress(event["iteration"], cap))
                box.markdown(f"**Draft {event['iteration'] + 1}**")
                answer, slot = "", box.empty()
            elif kind in ("worker_token", "worker_message") and slot is not None:
                if kind == "worker_token":
                    answer += event["text"]
                    slot.markdown(sup.streaming_markdown(answer))
                else:
                    answer = event["text"]
                    slot.markdown(sup.answer_markdown(answer))
            elif kind == "evaluation_started":
                pass_slot = box.empty()
                pass_slot.info(f"Grading pass {event['iteration'] + 1}…")
            elif kind == "evaluation_finished" and pass_slot is not None:
                evaluation = event["evaluation"]
                with pass_slot.container():
                    st.markdown(sup.pass_headline(evaluation))
                    st.caption(evaluation["explanation"])
                    st.dataframe(sup.verdict_frame(
                        evaluation, grader_model=run.settings.grader_model,
                        tool_names=run.settings.grader_tools), hide_index=True,
                                 width="stretch", column_config=VERDICT_COLUMNS)
            elif kind == "run_finished":
                ok = event["status"] == "satisfied"
                bar.progress(1.0, text=f"Finished: {event['status']}")
                cost_slot.caption(sup.live_cost_caption(spent, ended=True))
                box.update(label=f"Run finished: {event['status']}",
                           state="complete" if ok else "error", expanded=True)


@st.fragment(run_every=1.0)
def still_stopping(run_id: str) -> None:
    # Redrawn every second until the run has let go, then the whole page shows its result.
    if not session.is_active(run_id):
        st.rerun()
    st.info("This run is still stopping (or running in another tab); this page updates by "
            "itself.", icon=":material/hourglass_top:")


st.header("Run", divider="gray")
last = state.get("last_run_id")
# A Stop reruns this page on a new thread while the old one is still closing the run.
stopping = last if last and not session.wait_until_inactive(last, timeout_s=2.0) else None
wanted = state.pop("resume_request", None)
changes = state.pop("resume_changes", None) or sup.ResumeChanges()
resuming = store.get_run(wanted) if store is not None and wanted else None
shown = resuming.settings if resuming is not None else form
if resuming is not None:
    shown = sup.changed_settings(shown, changes)
    st.info(sup.resuming_text(resuming, changes), icon=":material/replay:")
# Model names wrap instead of being cut off (a metric truncates a long provider:model).
cols = st.columns([3, 3, 1, 1])
for col, label, model in ((cols[0], "Worker", shown.worker_model),
                          (cols[1], "Grader", shown.grader_model)):
    col.markdown(f"<small>{label}</small><br><span style='font-size:1.5rem;"
                 f"overflow-wrap:anywhere'>{html.escape(model)}</span>",
                 unsafe_allow_html=True)
cols[2].metric("Max iterations", shown.max_iterations)
cols[3].metric("Criteria", len(parse_criteria(shown.rubric)))
with st.expander("What is being resumed" if resuming else "What will run",
                 expanded=not shown.prompt.strip()):
    st.markdown(f"**Prompt**\n\n{shown.prompt or '_(empty)_'}")
    st.markdown(f"**Rubric**\n\n{shown.rubric or '_(empty)_'}")
    st.caption(f"Grader tools: {', '.join(shown.grader_tools) or 'none'}"
               + (f" · base URL {shown.base_url}" if shown.base_url else ""))

problems = [] if resuming else sup.check_form(form, secrets=secrets, session_key=key)
for problem in problems:
    getattr(st, problem.level)(problem.text)
if store is None:
    st.error(state.get("store_error") or "The database cannot be used.")
blocked = store is None or any(p.level == "error" for p in problems)

start_col, stop_col = st.columns([1, 5])
start = start_col.button("Run rubric loop", key="run_button", type="primary",
                         disabled=blocked, icon=":material/play_arrow:")
starting = store is not None and ((start and not blocked) or resuming is not None)
# Stop works only while a run of this session is active: the one about to start here, or one
# still running (or stopping) on another script thread.
active = starting or bool(last and session.is_active(last))
stop_slot = stop_col.empty()
# The callback reads the run id when pressed: the run may have started after this was drawn.
stop_slot.button("Stop", key="stop_button", icon=":material/stop:", disabled=not active,
                 on_click=lambda: session.request_stop(state.get("last_run_id")),
                 help="Stops the run at once (a model call in progress is abandoned); its "
                 "thread is kept and can be resumed." if active
                 else "Nothing of this session is running.")

# Everything below lives in one slot: a new run replaces the last run's answer at once
# instead of leaving it on screen (greyed) until the run ends.
below = st.empty().container()
with below:
    try:
        if start and store is not None and not resuming:
            live(session.start(store, form, models=models))
        elif resuming is not None and store is not None:
            live(session.resume(store, resuming.run_id, models=sup.resume_models(
                secrets, changes, session_key=key, sidebar_base_url=form.base_url,
                token_delay_s=token_delay_s, grader_pause_s=grader_pause_s),
                base_url=changes.base_url, worker_model=changes.worker_model,
                grader_model=changes.grader_model))
    except (ModelConfigError, ValueError, RuntimeError, KeyError, StoreError) as exc:
        st.error(f"The run could not start or be recorded: {exc}")
    if starting:  # the run has ended: nothing is left to stop
        stop_slot.button("Stop", key="stop_button_idle", icon=":material/stop:", disabled=True,
                         help="Nothing of this session is running.")

    last = state.get("last_run_id")  # set by the run above, if one was started
    # Listed after the run above has ended, so the picker shows what can be resumed now.
    resumable = session.resumable_runs(store) if store is not None else []
    if resumable:
        by_id = {r.run_id: r for r in resumable}
        res_col, res_btn = st.columns([4, 1], vertical_alignment="bottom")
        # The run just stopped comes first; the key changes with it so the choice resets.
        order = sorted(by_id, key=lambda rid: rid != last)
        picked = res_col.selectbox("Interrupted runs", order, key=f"resume_select_{last}",
                                   format_func=lambda rid: sup.run_label(by_id[rid]))
        res_btn.button("Resume", key="resume_button", icon=":material/replay:",
                       on_click=request_resume, args=(picked,))
        target = by_id[picked].settings
        with st.expander("Resume with another endpoint or models",
                         expanded=by_id[picked].status == "error"):
            st.caption("The run continues from where it stopped; what you change here is "
                       "recorded in its settings. A key typed here is sent only to this base URL "
                       "and never stored.")
            names = sup.resume_widget_keys(picked)
            for name, label, value in (("base_url", "Base URL", target.base_url or ""),
                                       ("worker_model", "Worker model", target.worker_model),
                                       ("grader_model", "Grader model", target.grader_model)):
                state.setdefault(names[name], value)
                st.text_input(label, key=names[name])
            st.text_input("API key for this base URL (optional)", key=names["api_key"],
                          type="password")
            redact.register_secret(state.get(names["api_key"]))


    if store is not None and last:
        st.subheader("Last run")
        if last == stopping and session.is_active(last):
            still_stopping(last)
        show_result(last)
