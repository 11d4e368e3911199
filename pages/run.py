"""Run: start the rubric loop and watch it live; resume interrupted runs; the last result."""

from __future__ import annotations

from contextlib import closing

import streamlit as st

from rubric_core import app_support as sup
from rubric_core.models import ModelConfigError
from rubric_core.rubric import parse_criteria
from rubric_core.runner import run_rubric
from rubric_core.store import StoreError

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/run.py"
    st.switch_page("app.py")
store = state.get("store")
secrets = sup.safe_mapping(st.secrets)
form = sup.RunForm.from_state(state)


def show_result(run_id: str) -> None:
    record = store.get_run(run_id)
    if record is None:
        return
    evaluations = store.evaluations(run_id)
    advice = sup.next_steps(record.status, error=record.error, grader_model=record.grader_model)
    with st.container(key="final_status", border=True):
        getattr(st, advice.level)(advice.headline)
        for step in advice.steps:
            st.markdown(f"- {step}")
        if evaluations and record.status != "satisfied":
            st.caption(f"Grader's last explanation: {evaluations[-1]['explanation']}")
        cols = st.columns(4)
        cols[0].metric("Status", record.status)
        cols[1].metric("Grader passes", record.iterations)
        cols[2].metric("Duration", f"{record.duration_s or 0:.1f} s")
        cols[3].metric("Run id", record.run_id[:8])
    if evaluations:
        st.markdown("**Final answer**")
        st.markdown(sup.answer_markdown(evaluations[-1]["answer"]))


def live(run_id: str, cap: int, events, prior_duration_s: float = 0.0) -> None:
    state["last_run_id"] = run_id  # a stop reruns the page: show this run's state then
    bar = st.progress(0.0, text="Starting…")
    box = st.status("Running the rubric loop…", expanded=True)
    answer, slot, pass_slot = "", None, None
    with closing(sup.recorded_events(store, run_id, events,
                                     prior_duration_s=prior_duration_s)) as stream:
        for event in stream:
            kind = event["type"]
            if kind == "worker_started":
                bar.progress(*sup.progress(event["iteration"], cap))
                box.markdown(f"**Draft {event['iteration'] + 1}**")
                answer, slot = "", box.empty()
            elif kind in ("worker_token", "worker_message") and slot is not None:
                answer = answer + event["text"] if kind == "worker_token" else event["text"]
                slot.markdown(sup.answer_markdown(answer))
            elif kind == "evaluation_started":
                pass_slot = box.empty()
                pass_slot.info(f"Grading pass {event['iteration'] + 1}…")
            elif kind == "evaluation_finished" and pass_slot is not None:
                evaluation = event["evaluation"]
                with pass_slot.container():
                    st.markdown(sup.pass_headline(evaluation))
                    st.caption(evaluation["explanation"])
                    st.dataframe(sup.verdict_frame(evaluation), hide_index=True)
            elif kind == "run_finished":
                ok = event["status"] == "satisfied"
                bar.progress(1.0, text=f"Finished: {event['status']}")
                box.update(label=f"Run finished: {event['status']}",
                           state="complete" if ok else "error", expanded=True)


st.header("Run", divider="gray")
last = state.get("last_run_id")
# A Stop reruns this page on a new thread while the old one is still closing the run.
stopping = last if last and not sup.wait_until_inactive(last, timeout_s=5.0) else None
cols = st.columns(4)
cols[0].metric("Worker", form.worker_model)
cols[1].metric("Grader", form.grader_model)
cols[2].metric("Max iterations", form.max_iterations)
cols[3].metric("Criteria", len(parse_criteria(form.rubric)))
with st.expander("What will run", expanded=not form.prompt.strip()):
    st.markdown(f"**Prompt**\n\n{form.prompt or '_(empty)_'}")
    st.markdown(f"**Rubric**\n\n{form.rubric or '_(empty)_'}")
    st.caption(f"Grader tools: {', '.join(form.tool_names) or 'none'}")

problems = sup.check_form(form, secrets=secrets)
for problem in problems:
    getattr(st, problem.level)(problem.text)
if store is None:
    st.error(state.get("store_error") or "The database cannot be used.")
blocked = store is None or any(p.level == "error" for p in problems)

start_col, stop_col = st.columns([1, 5])
start = start_col.button("Run rubric loop", key="run_button", type="primary",
                         disabled=blocked, icon=":material/play_arrow:")
stop_col.button("Stop", key="stop_button", icon=":material/stop:",
                help="Stops the run; its thread is kept and can be resumed below.")

resumable = [
    r for r in (store.list_runs(status=list(sup.RESUMABLE_STATUSES), limit=20) if store else [])
    if not sup.is_active(r.run_id)  # running in another tab, or still stopping
]
resume = False
if resumable:
    by_id = {r.run_id: r for r in resumable}
    res_col, res_btn = st.columns([4, 1], vertical_alignment="bottom")
    # The run just stopped comes first; the key changes with it so the choice resets.
    order = sorted(by_id, key=lambda rid: rid != last)
    picked = res_col.selectbox("Interrupted runs", order, key=f"resume_select_{last}",
                               format_func=lambda rid: sup.run_label(by_id[rid]))
    resume = res_btn.button("Resume", key="resume_button", icon=":material/replay:")

delay = sup.token_delay(sup.env_token_delay(), state.get("token_delay_s"))
try:
    if start and store is not None:
        spec = sup.build_run_spec(form, secrets=secrets, token_delay_s=delay)
        record = sup.start_run(store, form)
        live(record.run_id, spec.max_iterations,
             run_rubric(spec, checkpointer=store.saver(), thread_id=record.thread_id))
    elif resume and store is not None:
        record = by_id[picked]
        rform = sup.resume_form(record, form)
        spec = sup.build_run_spec(rform, secrets=secrets, token_delay_s=delay)
        store.finish_run(record.run_id, "running")
        live(record.run_id, spec.max_iterations,
             run_rubric(spec, checkpointer=store.saver(), thread_id=record.thread_id,
                        resume=True),
             prior_duration_s=record.duration_s or 0.0)
except (ModelConfigError, ValueError, RuntimeError, StoreError) as exc:
    st.error(f"The run could not start or be recorded: {exc}")

last = state.get("last_run_id")  # set by the run above, if one was started
if store is not None and last:
    st.subheader("Last run")
    if last == stopping:
        st.info("This run is still stopping (or running in another tab). Refresh in a moment.")
    show_result(last)
