"""Review: the run history (paged), one run's iterations, heatmap, side-by-side diff, export."""

from __future__ import annotations

import streamlit as st

from rubric_core import app_support as sup
from rubric_core import session
from rubric_core.export import export_rows
from rubric_core.types import RUN_STATUSES

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/review.py"
    st.switch_page("app.py")
store = state.get("store")


def show_messages(messages: list[sup.UiMessage]) -> None:
    for message in messages:
        getattr(st, message.level)(message.text)


def side_by_side(label_a: str, ev_a: dict, label_b: str, ev_b: dict,
                 rubrics: tuple[str, str] | None = None) -> None:
    left, right = st.columns(2)
    for col, label, ev in ((left, label_a, ev_a), (right, label_b, ev_b)):
        with col.container(border=True):
            st.markdown(f"**{label}** · {sup.pass_headline(ev)}")
            st.markdown(sup.answer_markdown(ev.get("answer", "")))
    st.markdown("**Word-level changes** (green: added, red: removed)")
    with st.container(border=True, key="answer_diff"):
        st.html(sup.diff_html(ev_a.get("answer", ""), ev_b.get("answer", "")))
    show_messages(sup.changes_summary(ev_a, ev_b, rubrics=rubrics))


st.header("Review", divider="gray")
if store is None:
    st.error(state.get("store_error") or "The database cannot be used.")
    st.stop()

session.reconcile(store)  # runs whose process died are shown as interrupted
st.subheader("History")
f_status, f_model, f_text, f_page = st.columns([3, 2, 3, 1])
statuses = f_status.multiselect("Status", sorted(RUN_STATUSES), key="filter_status")
model = f_model.text_input("Model (worker or grader, exact)", key="filter_model",
                           placeholder="e.g. demo")
text = f_text.text_input("Title, prompt or rubric contains", key="filter_text")
filters = sup.RunFilters(tuple(statuses), model, text)
total = store.count_runs(**filters.kwargs())
pages = sup.page_count(total)
if state.get("history_page", 1) > pages:
    state["history_page"] = pages
page = f_page.number_input(f"Page (of {pages})", min_value=1, max_value=pages,
                           key="history_page")
size = sup.HISTORY_PAGE_SIZE
runs = store.list_runs(limit=size, offset=(page - 1) * size, **filters.kwargs())
st.caption(f"{total} run(s) match; showing {len(runs)}, most recent first.")
st.dataframe(sup.history_frame(runs), hide_index=True, width="stretch",
             height=min(250, 38 + 35 * max(len(runs), 1)))
if not runs:
    st.info("No runs match these filters. Clear them, or start a run on the Run page.")
    st.stop()

by_id = {r.run_id: r for r in runs}
run_id = st.selectbox("Run to review", list(by_id), key="review_run",
                      format_func=lambda rid: sup.run_label(by_id[rid]))
record = by_id[run_id]
evaluations = store.evaluations(run_id)
cols = st.columns(4)
cols[0].metric("Status", record.status)
cols[1].metric("Grader passes", record.iterations)
cols[2].metric("Duration", f"{record.duration_s or 0:.1f} s")
tokens = None if record.input_tokens is None and record.output_tokens is None else (
    (record.input_tokens or 0) + (record.output_tokens or 0))
cols[3].metric("Grader tokens", "n/a" if tokens is None else tokens,
               help="Reported by the grader's provider; offline graders report none.")
with st.expander("Prompt, rubric and models"):
    st.markdown(f"**Prompt**\n\n{record.prompt}\n\n**Rubric**\n\n{record.rubric}")
    for label, text in (("Worker system prompt", record.worker_system_prompt),
                        ("Custom grader prompt", record.grader_system_prompt)):
        if text:
            st.markdown(f"**{label}**")
            st.text(text)
    if record.grader_tools is not None:
        st.caption("Grader tools: " + (", ".join(record.grader_tools) or "none"))
    base_url = f" · base URL {record.settings.base_url}" if record.settings.base_url else ""
    st.caption(f"Worker {record.worker_model} · grader {record.grader_model}{base_url} · "
               f"max {record.max_iterations} iterations · run id {record.run_id}")
if record.error:
    st.error(f"Error: {record.error}")

table_tab, heat_tab, compare_tab, export_tab = st.tabs(
    ["Iterations", "Heatmap", "Side by side", "Export"])
with table_tab:
    st.dataframe(sup.iteration_table(evaluations), hide_index=True, width="stretch")
with heat_tab:
    heat = sup.heatmap_table(evaluations, record.rubric)
    st.dataframe(heat.style.map(sup.heatmap_css), width="stretch")
with compare_tab:
    mode = st.radio("Compare", ["Two iterations of this run", "Final answers of two runs"],
                    key="cmp_mode", horizontal=True)
    if mode == "Two iterations of this run" and evaluations:
        iterations = list(sup.iteration_answers(evaluations))
        col_a, col_b = st.columns(2)
        a = col_a.selectbox("Before", iterations, index=0, key=f"cmp_a_{run_id}",
                            format_func=lambda i: f"Iteration {i}")
        b = col_b.selectbox("After", iterations, index=len(iterations) - 1, key=f"cmp_b_{run_id}",
                            format_func=lambda i: f"Iteration {i}")
        side_by_side(f"Iteration {a}", sup.evaluation_at(evaluations, a),
                     f"Iteration {b}", sup.evaluation_at(evaluations, b))
    elif mode == "Final answers of two runs":
        others = [rid for rid in by_id if rid != run_id and by_id[rid].iterations]
        other = st.selectbox("Compare with", others, key="cmp_run",
                             format_func=lambda rid: sup.run_label(by_id[rid]))
        other_evs = store.evaluations(other) if other else []
        if evaluations and other_evs:
            side_by_side("This run", evaluations[-1], "Other run", other_evs[-1],
                         rubrics=(record.rubric, by_id[other].rubric))
        else:
            st.info("Pick another graded run on this page of the history to compare with.")
    else:
        st.info("This run has no graded iterations yet.")
with export_tab:
    st.markdown("**This run** — one row per iteration × criterion")
    csv_data, json_data = sup.export_bytes(export_rows([(record, evaluations)]))
    c1, c2 = st.columns(2)
    c1.download_button("Download CSV", csv_data, f"run-{run_id[:8]}.csv", "text/csv",
                       key="download_run_csv", on_click="ignore", icon=":material/download:")
    c2.download_button("Download JSON", json_data, f"run-{run_id[:8]}.json",
                       "application/json", key="download_run_json", on_click="ignore",
                       icon=":material/download:")
    st.markdown(f"**Every run matching the filters** ({total})")
    if st.button(f"Prepare export of {total} run(s)", key="prepare_export"):
        state["export_filters"] = filters
    if state.get("export_filters") == filters:
        all_csv, all_json = sup.export_bytes(export_rows(sup.filtered_pairs(store, filters)))
        c3, c4 = st.columns(2)
        c3.download_button("Download all as CSV", all_csv, "rubric-runs.csv", "text/csv",
                           key="download_all_csv", on_click="ignore")
        c4.download_button("Download all as JSON", all_json, "rubric-runs.json",
                           "application/json", key="download_all_json", on_click="ignore")
