"""Review: the run history (paged), one run's iterations, heatmap, side-by-side diff, export."""

from __future__ import annotations

import streamlit as st

from pages._calls_view import draw_calls
from pages._pairwise_view import draw_head_to_head
from rubric_core import app_support as sup
from rubric_core import session
from rubric_core.costs import store_costs
from rubric_core.export import export_rows
from rubric_core.types import RUN_STATUSES

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/review.py"
    st.switch_page("app.py")
store = state.get("store")


# Long titles, model names and gaps: wide columns, full text on hover (help) and in expanders.
HISTORY_COLUMNS = {  # every column labelled, so the headers read alike
    "created": st.column_config.TextColumn("Created"),
    "title": st.column_config.TextColumn("Title", width="large"),
    "status": st.column_config.TextColumn("Status"),
    "cost": st.column_config.TextColumn("Cost", help="Worker and grader, at known prices"),
    "worker": st.column_config.TextColumn("Worker", width="medium"),
    "grader": st.column_config.TextColumn("Grader", width="medium"),
    "iterations": st.column_config.NumberColumn("Passes", help="Grader passes"),
    "duration_s": st.column_config.NumberColumn("Duration (s)", format="%.1f"),
    "run_id": st.column_config.TextColumn("Run ID"),
}
ITERATION_COLUMNS = {
    "criterion": st.column_config.TextColumn("Criterion", width="medium"),
    "gap": st.column_config.TextColumn("Gap", width="large",
                                       help="What the grader found missing or wrong"),
    "note": st.column_config.TextColumn(
        "Note", width="medium",
        help="regressed: passed on the previous pass, fails now; with grader repeats, how many "
        "agreed (unstable when they did not all agree)"),
    "explanation": st.column_config.TextColumn("Explanation", width="large"),
}


def open_run(run_id: str) -> None:
    # Applied before the run picker is drawn (a widget's value cannot change after that).
    state["open_request"] = run_id


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
origin = st.segmented_control(
    "Show", list(sup.ORIGIN_CHOICES), key="filter_origin",
    format_func=lambda o: sup.ORIGIN_CHOICES[o],
    help="Single runs: started on the Run page or with `rubric-studio run`. Experiment cells: "
    "the runs of experiments (open an experiment on its page for its grid).")
f_status, f_model, f_text, f_page = st.columns([3, 2, 3, 1])
statuses = f_status.multiselect("Status", sorted(RUN_STATUSES), key="filter_status")
model = f_model.text_input("Model (worker or grader, exact)", key="filter_model",
                           placeholder="e.g. demo")
text = f_text.text_input("Title, prompt or rubric contains", key="filter_text")
filters = sup.RunFilters(tuple(statuses), model, text, origin or "all")
total = store.count_runs(**filters.kwargs())
pages = sup.page_count(total)
if state.get("history_page", 1) > pages:
    state["history_page"] = pages
page = f_page.number_input(f"Page (of {pages})", min_value=1, max_value=pages,
                           key="history_page")
size = sup.HISTORY_PAGE_SIZE
runs = store.list_runs(limit=size, offset=(page - 1) * size, **filters.kwargs())
st.caption(f"{total} run(s) match; showing {len(runs)}, most recent first. "
           "Select a row to open that run.")
prices = sup.session_prices(state).prices
history = st.dataframe(sup.history_frame(runs, sup.run_list_costs(store, prices, runs)),
                       hide_index=True, width="stretch",
                       height=min(250, 38 + 35 * max(len(runs), 1)), key="history_table",
                       column_config=HISTORY_COLUMNS, on_select="rerun",
                       selection_mode="single-row")
picked = sup.picked_row(history, [r.run_id for r in runs])
if picked is not None and picked != state.get("history_opened"):
    open_run(picked)  # only a new selection moves the picker; it stays free to change
state["history_opened"] = picked

by_id = {r.run_id: r for r in runs}
if (requested := state.pop("open_request", None)) is not None:
    found = sup.find_run(store, requested)  # a link's id may be a prefix or a thread's
    if found.target_id is not None:
        # Kept in the picker even when the history filters or page would hide it.
        state["pinned_run"] = state["review_run"] = found.target_id
    else:
        state.pop("review_run", None)  # never another run in the place of the linked one
    state["review_link_problem"] = found.problem
elif state.get("review_run") is not None:
    state.pop("review_link_problem", None)  # a run was picked since
pinned = state.get("pinned_run")
if pinned and pinned not in by_id and (pinned_record := store.get_run(pinned)) is not None:
    by_id = {pinned: pinned_record, **by_id}
if link_problem := state.get("review_link_problem"):
    st.warning(link_problem, icon=":material/link_off:")
if not by_id:
    st.info("No runs match these filters. Clear them (or show every run above), or start a "
            "run on the Run page.")
    st.stop()
run_id = st.selectbox("Run to review", list(by_id), key="review_run",
                      index=None if link_problem else 0, placeholder="Pick a run to review",
                      format_func=lambda rid: sup.run_label(by_id[rid]))
if run_id is None:
    st.stop()
record = by_id[run_id]
sup.show_link(state, st.query_params, "run", run_id)  # the address bar links to this run
link = sup.link_for("run", run_id)
st.caption(f"Link to this run: [{link}]({link}) (or copy the address bar)")
evaluations = store.evaluations(run_id)
cols = st.columns(4)
cols[0].metric("Status", record.status)
cols[1].metric("Grader passes", record.iterations)
cols[2].metric("Duration", f"{record.duration_s or 0:.1f} s")
tokens = None if record.input_tokens is None and record.output_tokens is None else (
    (record.input_tokens or 0) + (record.output_tokens or 0))
cols[3].metric("Grader tokens", "n/a" if tokens is None else tokens,
               help="Reported by the grader's provider; offline graders report none.")
if caption := sup.tokens_caption(record):
    st.caption(caption)
run_cost = sup.run_cost_of(store, prices, record)
st.caption(sup.cost_caption(run_cost))
if run_cost.passes:
    with st.expander("Cost per pass"):
        st.dataframe(sup.pass_costs_frame(run_cost), hide_index=True, key="review_pass_costs")
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
for i, answer in enumerate(sup.shown_answers(evaluations)):
    with st.expander(sup.answer_heading(answer, first=i == 0).replace("**", ""),
                     expanded=i == 0):
        st.markdown(sup.answer_markdown(answer.text))

(table_tab, heat_tab, compare_tab, labels_tab, agreement_tab, analytics_tab,
 export_tab, calls_tab) = st.tabs(["Iterations", "Heatmap", "Side by side", "Labels",
                                   "Agreement", "Loop analytics", "Export", "Calls"])
with calls_tab:
    draw_calls(store, run_id, key="review")
with table_tab:
    table = sup.iteration_table(evaluations, grader_model=record.grader_model,
                                tool_names=record.grader_tools or ())
    st.dataframe(table, hide_index=True, width="stretch", column_config=ITERATION_COLUMNS)
    gaps = table[table["gap"].astype(str).str.strip() != ""]
    if not gaps.empty:
        with st.expander(f"Full text of the {len(gaps)} gap(s)"):
            for row in gaps.to_dict("records"):
                st.markdown(f"**Pass {row['pass']} · {row['criterion']}**")
                st.text(row["gap"])
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
                            format_func=lambda i: f"Pass {i}")
        b = col_b.selectbox("After", iterations, index=len(iterations) - 1, key=f"cmp_b_{run_id}",
                            format_func=lambda i: f"Pass {i}")
        side_by_side(f"Pass {a}", sup.evaluation_at(evaluations, a),
                     f"Pass {b}", sup.evaluation_at(evaluations, b))
        draw_head_to_head(store, sup.passes_head_to_head(record, evaluations, a, b), key="review")
    elif mode == "Final answers of two runs":
        others = [rid for rid in by_id if rid != run_id and by_id[rid].iterations]
        other = st.selectbox("Compare with", others, key="cmp_run",
                             format_func=lambda rid: sup.run_label(by_id[rid]))
        other_evs = store.evaluations(other) if other else []
        if evaluations and other_evs:
            side_by_side("This run", evaluations[-1], "Other run", other_evs[-1],
                         rubrics=(record.rubric, by_id[other].rubric))
            draw_head_to_head(store, sup.runs_head_to_head(record, evaluations, by_id[other],
                                                           other_evs), key="review")
        else:
            st.info("Pick another graded run on this page of the history to compare with.")
    else:
        st.info("This run has no graded iterations yet.")
with labels_tab:
    targets = sup.label_targets(evaluations)
    if not targets:
        st.info("This run has no criterion verdicts to label yet.")
    else:
        st.text_input("Your name", key="labeller",
                      help="Stored with each label; defaults to this computer's user name.")
        target = st.selectbox("Verdict to label", targets, key=f"label_target_{run_id}",
                              format_func=lambda t: sup.target_label(evaluations, t))
        l_col, c_col = st.columns(2)
        label = l_col.radio("You", sup.LABEL_CHOICES, key="label_choice", horizontal=True,
                            format_func=lambda c: f"{c} with the grader")
        correct = c_col.selectbox("Correct verdict (optional)", sup.CORRECT_CHOICES,
                                  key="label_correct", disabled=label == "agree")
        note = st.text_input("Note (optional)", key="label_note")
        if st.button("Save label", key="save_label", icon=":material/label:"):
            show_messages([sup.save_label(store, sup.LabelInput(
                run_id, target, state["labeller"], label, correct, note))])
        run_labels = store.labels([run_id])
        st.caption(f"{len(run_labels)} label(s) on this run.")
        if run_labels:
            st.dataframe(sup.run_labels_frame(evaluations, run_labels), hide_index=True,
                         width="stretch", column_config=ITERATION_COLUMNS)
with agreement_tab:
    view = sup.agreement_view(store)
    if view.table["n"].iloc[-1] == 0:
        st.info("No labels yet: label verdicts on the Labels tab to compare the grader with "
                "people.")
    else:
        st.caption("Grader vs people over every labelled verdict in this database, across "
                   "runs: percent agreement and Cohen's κ (empty when undefined: one verdict "
                   "throughout), with n pairs.")
        st.dataframe(view.table, hide_index=True, width="stretch", column_config={
            "criterion": st.column_config.TextColumn("Criterion", width="large"),
            "percent_agreement": st.column_config.NumberColumn("Agreement %", format="%.1f"),
            "kappa": st.column_config.NumberColumn("Cohen's κ", format="%.3f")})
        st.markdown(f"**Disagreements** ({len(view.run_ids)}): select one to open its run")
        chosen = st.dataframe(view.disagreements, hide_index=True, width="stretch",
                              key="disagreements_table", on_select="rerun",
                              selection_mode="single-row", column_config=ITERATION_COLUMNS)
        opened = sup.picked_row(chosen, view.run_ids)
        if opened is not None and opened != state.get("disagreement_opened"):
            state["disagreement_opened"] = opened
            open_run(opened)
            st.rerun()
        state["disagreement_opened"] = opened
        st.markdown("**Align the grader with the labels of this run's rubric**")
        inputs = sup.alignment_inputs(store, record.rubric)
        grader_name = state.get("grader_model", "rules")
        st.caption(
            f"Re-grades up to {sup.MAX_ALIGN_ANSWERS} labelled answers of runs with this "
            f"rubric with the sidebar's grader (`{grader_name}`) twice, without and with their "
            "labelled verdicts as few-shot examples (never an answer's own label), and shows "
            f"the agreement with people both ways: {2 * len(inputs.items)} grader calls.")
        if st.button("Re-grade with and without the examples", key="align_run",
                     disabled=not inputs.items, icon=":material/balance:"):
            try:
                with st.spinner("Re-grading the labelled answers ..."):
                    state["align_result"] = sup.align_with_sidebar_grader(
                        inputs, state, sup.safe_mapping(st.secrets))
                    state["align_rubric"] = record.rubric
            except Exception as exc:  # a model that cannot be built or called: say so
                st.error(f"The Align check could not run: {type(exc).__name__}: {exc}")
        if "align_result" in state and state.get("align_rubric") == record.rubric:
            st.dataframe(state["align_result"], hide_index=True, width="stretch")
            if st.button("Use these examples in the custom grader prompt", key="align_use"):
                state["grader_system_prompt"] = sup.aligned_grader_prompt(inputs)
                st.success("The custom grader prompt (Author page) now holds the examples.")
with analytics_tab:
    scope = st.radio("Runs", sup.ANALYTICS_SCOPES, key="analytics_scope", horizontal=True)
    experiments = {e.experiment_id: e for e in store.list_experiments()}
    if scope == "An experiment" and not experiments:
        st.info("No experiments yet: start one on the Experiments page.")
    else:
        experiment_id = None
        if scope == "An experiment":
            own = sup.experiment_of_run(store, record, list(experiments.values()))
            experiment_id = st.selectbox(
                "Experiment", list(experiments), key=f"analytics_experiment_{run_id}",
                index=list(experiments).index(own) if own else 0,
                format_func=lambda eid: sup.experiment_label(experiments[eid]))
        analytics, n_runs = sup.analytics_for(store, record, scope, experiment_id)
        if analytics.empty:
            st.info("No graded passes to analyse yet.")
        else:
            st.caption(f"Per criterion over {n_runs} run(s): first-pass fail rate, mean "
                       "passes to fix, oscillations (pass → fail → pass), feedback efficacy, "
                       "tokens on the revisions it forced and instability under repeats.")
            st.dataframe(analytics, hide_index=True, width="stretch", column_config={
                "criterion": st.column_config.TextColumn("Criterion", width="large")})
            measure = st.selectbox("Chart", list(sup.CHART_MEASURES), key="analytics_measure",
                                   format_func=sup.CHART_MEASURES.__getitem__)
            st.altair_chart(sup.analytics_chart(analytics, measure), width="stretch")
            st.download_button("Download analytics CSV", sup.analytics_csv(analytics),
                               f"analytics-{run_id[:8]}.csv", "text/csv",
                               key="download_analytics_csv", on_click="ignore",
                               icon=":material/download:")
with export_tab:
    st.markdown("**This run** — one row per iteration × criterion")
    costs = store_costs(store, prices)
    csv_data, json_data = sup.export_bytes(export_rows([(record, evaluations)], calls=store,
                                                       costs=costs))
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
        all_csv, all_json = sup.export_bytes(export_rows(sup.filtered_pairs(store, filters),
                                                         costs=costs))
        c3, c4 = st.columns(2)
        c3.download_button("Download all as CSV", all_csv, "rubric-runs.csv", "text/csv",
                           key="download_all_csv", on_click="ignore")
        c4.download_button("Download all as JSON", all_json, "rubric-runs.json",
                           "application/json", key="download_all_json", on_click="ignore")
    st.markdown("**Labels** — every person's label in this database")
    st.download_button("Download labels CSV", sup.labels_csv(store), "rubric-labels.csv",
                       "text/csv", key="download_labels_csv", on_click="ignore",
                       icon=":material/download:")
