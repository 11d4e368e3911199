"""Experiments: datasets, a dataset × configurations run live (Stop, Resume, retry), results."""

from __future__ import annotations

import os
import time
from contextlib import closing
from typing import TYPE_CHECKING

import streamlit as st

from pages._pairwise_view import draw_head_to_head
from rubric_core import app_support as sup
from rubric_core.experiments import BudgetError, SharedBackoff, experiment_results, retry_cell

if TYPE_CHECKING:
    from collections.abc import Sequence

    from streamlit.delta_generator import DeltaGenerator

    from rubric_core.experiments import Budget
    from rubric_core.settings import ExperimentConfig
    from rubric_core.store import ExperimentRecord
    from rubric_core.types import ExperimentProgress

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/experiments.py"
    st.switch_page("app.py")
store = state.get("store")
secrets = sup.safe_mapping(st.secrets)
key = sup.session_key(state)
sup.keep_form(state)
backoff = SharedBackoff()  # one per script run: the experiment it starts shares it
_, grader_pause_s = sup.demo_pacing(sup.env_token_delay(), state.get("pace_demo"),
                                    state.get("token_delay_s"))
models = sup.app_models(secrets, session_key=key, sidebar_base_url=state.get("base_url"),
                        token_delay_s=0.0, backoff=backoff, grader_pause_s=grader_pause_s)
prices = sup.session_prices(state).prices  # the sidebar's Cost prices
RESUME_HELP = "Continue the cells that have not ended, each on its own thread."
BUDGET_HELP = ("No cell starts that would spend past it: what was spent plus an estimate per "
               "cell (the mean of the configuration's ended cells; before any, its cap of "
               "typical calls). The experiment then stops, resumable; Resume keeps the budget, "
               "or uses the one typed here. Needs every model's price (sidebar, Cost).")
CONCURRENCY_HELP = ("The cells go on the experiment's queue in the database; this app runs them, "
                    "and so does every `rubric-studio worker` on that database, within this "
                    "concurrency over all of them. Stop cancels the queued and running cells; "
                    "Resume queues them again.")
RATE_HELP = "At most this many cells start per period, over every process (0: no limit)."
CONFIG_LIMIT_HELP = ("At most this many of this configuration's cells run at once, over every "
                     "process, within the concurrency (0: no limit).")
CONFIG_RATE_HELP = ("At most this many of this configuration's cells start per minute, over "
                    "every process (0: no limit).")
MODEL_LIMITS_CAPTION = ("For a model's server or quota, over every process: a cell counts "
                        "against both its worker model and its grader model (0: no limit). "
                        "They apply to every experiment this page starts or resumes; the limits "
                        "in a configuration's box apply only to an experiment started from this "
                        "form.")
ESTIMATE_HELP = ("Before any cell ended: each cell at its cap of passes, each pass a worker call "
                 "of 2,000 tokens in and 1,000 out and the grader's repeats of 4,000 in and "
                 "500 out, nothing cached: on the high side. After: the mean of ended cells.")


def show(message: sup.UiMessage | None) -> None:
    if message is not None:
        getattr(st, message.level)(message.text)


def delete(record: ExperimentRecord) -> None:
    message = sup.delete_experiment(store, record)
    state["exp_message"] = message
    if message.level == "success":
        state.pop("exp_pick", None)


def store_dataset() -> None:
    # A callback: the Datasets panel's count, drawn after it, includes what was just stored.
    upload = state.get("dataset_upload")
    data = upload.getvalue() if upload is not None else state.get("dataset_paste", "")
    name = state.get("dataset_name") or sup.dataset_name_for(upload.name if upload else None)
    state["dataset_message"] = sup.import_dataset(store, data, name=name)


def load_demo_dataset() -> None:
    state["dataset_message"] = sup.import_demo_dataset(store)


def stop_elsewhere(experiment_id: str) -> None:
    state["exp_message"] = sup.stop_on_engine(store, experiment_id)


def draw_queue(slot: DeltaGenerator, view: sup.QueueView) -> None:
    with slot.container(border=True):
        st.markdown("**Queue** · DBOS queues")
        st.caption(view.headline)
        # Always a third element: redrawn in the same script run, a table left over from an
        # earlier draw would otherwise stay under the new counts.
        if len(view.workers):
            st.table(view.workers, hide_index=True, border="horizontal")  # a few rows: text
        else:
            st.caption("No cell is running on any worker.")


def live(experiment_id: str, labels: list[str], configurations: Sequence[ExperimentConfig], *,
         retry_errors: bool = False, budget: Budget | None = None,
         queue_slot: DeltaGenerator | None = None) -> None:
    bars = [st.progress(0.0, text=f"{label}: starting…") for label in labels]
    note = st.empty()
    drawn = 0.0
    progress: dict[int, ExperimentProgress] = {}
    try:
        # Per model and per configuration; a limit the library refuses is shown below.
        limits = sup.limits_from_state(state, configurations)
        events = sup.live_experiment(store, experiment_id, models=models, backoff=backoff,
                                     concurrency=state["exp_concurrency"],
                                     retry_errors=retry_errors, budget=budget,
                                     rate_limit=sup.rate_limit_from_state(state), **limits)
        with closing(events) as stream:
            for event in stream:
                if queue_slot is not None and time.monotonic() - drawn > 0.5:
                    # As cells end, at most twice a second.
                    draw_queue(queue_slot, sup.queue_view(store, experiment_id))
                    drawn = time.monotonic()
                if event["type"] == "experiment_progress":
                    progress[event["config_index"]] = event
                    bars[event["config_index"]].progress(*sup.progress_text(event))
                elif event["type"] == "experiment_backoff":
                    note.info(f"The model server answered {event['status_code']}: every cell "
                              f"waits {event['wait_s']:.1f} s (shared backoff, "
                              f"{event['hits']} so far).")
                elif event["type"] == "experiment_finished" and event.get("lost_database"):
                    lost = sup.lost_database_message(progress)  # said once, for every cell
                    getattr(note, lost.level)(lost.text, icon=":material/database:")
                elif event["type"] == "experiment_finished" and event.get("budget_reached"):
                    note.warning(f"Budget reached: {sup.format_dollars(event['spent_usd'])} "
                                 "spent, so no further cell started. Resume with a larger "
                                 "budget to continue.", icon=":material/savings:")
                elif event["type"] == "experiment_finished":
                    note.success(f"Experiment {event['status']} after {event['duration_s']:.1f} s.")
    except (RuntimeError, BudgetError, ValueError) as exc:
        st.error(str(exc))


st.header("Experiments", divider="gray")
if store is None:
    st.error(state.get("store_error") or "The database cannot be used.")
    st.stop()

# -- 1. datasets
datasets = store.list_datasets()
with st.expander(f"Datasets ({len(datasets)} stored)",
                 expanded=not datasets or "dataset_message" in state):
    st.caption("CSV or JSONL with a `prompt` column (it may use `{column}` variables), an "
               "optional `rubric` (a row's own rubric wins) and `id`; other columns are kept.")
    upload = st.file_uploader("Upload a dataset", type=["csv", "jsonl"], key="dataset_upload")
    st.text_area("…or paste CSV / JSONL", key="dataset_paste", height=100)
    name_col, store_col, demo_col = st.columns([3, 1, 2], vertical_alignment="bottom")
    name = name_col.text_input("Dataset name", key="dataset_name",
                               placeholder=sup.dataset_name_for(upload.name if upload else None))
    store_col.button("Store dataset", key="store_dataset", icon=":material/upload:",
                     on_click=store_dataset)
    demo_col.button("Load the bundled demo dataset", key="load_demo_dataset",
                    icon=":material/dataset:", on_click=load_demo_dataset)
    show(state.pop("dataset_message", None))
    if datasets:
        st.dataframe(sup.datasets_frame(datasets), hide_index=True, width="stretch")
        ds_col, ver_col, del_col = st.columns([3, 1, 1], vertical_alignment="bottom")
        shown = ds_col.selectbox("Preview", [d.name for d in datasets], key="dataset_shown")
        versions = [v.version for v in store.dataset_versions(shown)]
        version = ver_col.selectbox("Version", versions[::-1], key=f"dataset_version_{shown}")
        if del_col.button("Delete dataset", key="delete_dataset", icon=":material/delete:"):
            show(sup.delete_dataset(store, shown))
            st.rerun()
        st.dataframe(sup.dataset_preview(store, shown, version), hide_index=True,
                     width="stretch", height=220)

# -- 2. a new experiment
started = None
experiments = store.list_experiments()
with st.expander("New experiment", expanded=not experiments):
    if not datasets:
        st.info("Store a dataset first (or load the bundled demo dataset above).")
    else:
        d_col, v_col, n_col = st.columns([3, 1, 3])
        ds = d_col.selectbox("Dataset", [d.name for d in datasets], key="exp_dataset")
        ds_versions = [v.version for v in store.dataset_versions(ds)][::-1]
        ds_version = v_col.selectbox("Version", ds_versions, key=f"exp_dataset_version_{ds}")
        n_col.text_input("Experiment name (optional)", key="exp_name")
        st.text_area("Rubric — for rows without their own (a row's rubric wins)",
                     key="exp_rubric", height=100)
        r_col, c_col, k_col = st.columns(3)
        k_col.number_input("Configurations", 1, sup.MAX_CONFIGS, key="exp_config_count")
        r_col.number_input("Repeats", 1, sup.MAX_REPEATS, key="exp_repeats")
        c_col.number_input("Concurrency (cells at once)", 1, sup.MAX_CONCURRENCY,
                           key="exp_concurrency", help=CONCURRENCY_HELP)
        rl_col, rp_col, _ = st.columns([1, 1, 2], vertical_alignment="bottom")
        rl_col.number_input("Rate limit (cells; 0: none)", 0, sup.MAX_RATE_CELLS,
                            key="exp_rate_cells", help=RATE_HELP)
        rp_col.selectbox("per", list(sup.RATE_PERIODS), key="exp_rate_per")
        limits_slot = st.container()  # Limits per model, drawn once the boxes below are read
        tools = sup.default_tool_names()
        for i in range(state["exp_config_count"]):
            with st.container(border=True, key=f"exp_cfg_{i}"):
                st.markdown(f"**Configuration {i + 1}**")
                cols = st.columns([2, 2, 1, 2])
                for col, field, role in ((cols[0], "worker", "Worker"),
                                         (cols[1], "grader", "Grader")):
                    choices = sup.model_options(role.lower(), env=os.environ, secrets=secrets,
                                                base_url=state["base_url"],
                                                current=state[sup.config_key(i, field)])
                    col.selectbox(f"{role} model", [c.value for c in choices],
                                  key=sup.config_key(i, field), accept_new_options=True,
                                  format_func=lambda v, c=choices: sup.model_label(c, v))
                    picked_model = state[sup.config_key(i, field)]
                    if reason := next((c.reason for c in choices
                                       if c.value == picked_model and c.reason), None):
                        col.caption(f"Unavailable: {reason}")
                cols[2].number_input("Cap", sup.MIN_ITERATIONS, sup.MAX_ITERATIONS,
                                     key=sup.config_key(i, "cap"), help="Grader passes per cell")
                cols[3].text_input("Label (optional)", key=sup.config_key(i, "label"))
                s_col, t_col = st.columns(2)
                s_col.text_input("Worker system prompt", key=sup.config_key(i, "system"))
                t_col.multiselect("Grader tools", tools, key=sup.config_key(i, "tools"))
                r_col, c_col, b_col = st.columns([1, 1, 2], vertical_alignment="bottom")
                r_col.number_input("Grader repeats", 1, sup.MAX_GRADER_REPEATS,
                                   key=sup.config_key(i, "repeats"),
                                   help="Grade each answer this many times (see the sidebar)")
                c_col.selectbox("Consensus", sup.CONSENSUS_MODES,
                                key=sup.config_key(i, "consensus"),
                                disabled=state[sup.config_key(i, "repeats")] < 2)
                b_col.checkbox("Return the best attempt at the cap",
                               key=sup.config_key(i, "best"))
                l_col, p_col, _ = st.columns(3, vertical_alignment="bottom")
                l_col.number_input("Cells at once (0: no limit)", 0, sup.MAX_CONCURRENCY,
                                   key=sup.config_key(i, "limit"), help=CONFIG_LIMIT_HELP)
                p_col.number_input("Cells started per minute (0: none)", 0, sup.MAX_RATE_CELLS,
                                   key=sup.config_key(i, "rate"), help=CONFIG_RATE_HELP)
        configs = sup.configs_from_state(state)
        form_models = sup.form_models(configs)
        with limits_slot.expander("Limits per model"):
            st.caption(MODEL_LIMITS_CAPTION)
            editor = sup.model_limits_editor_key(form_models)
            st.data_editor(
                sup.model_limits_frame(state, form_models), key=editor, hide_index=True,
                width="stretch", num_rows="fixed", on_change=sup.keep_model_limit_edits,
                args=(state, editor, form_models),
                column_config={
                    "Model": st.column_config.TextColumn("Model", disabled=True),
                    "Cells at once": st.column_config.NumberColumn(
                        "Cells at once", min_value=0, max_value=sup.MAX_CONCURRENCY, step=1,
                        format="%d", help="At most this many cells using the model run at "
                        "once, over every process (0: no limit)."),
                    "Cells started per minute": st.column_config.NumberColumn(
                        "Cells started per minute", min_value=0, max_value=sup.MAX_RATE_CELLS,
                        step=1, format="%d", help="At most this many cells using the model "
                        "start per minute, over every process (0: no limit).")})
        dataset = sup.stored_dataset(store, ds, ds_version)
        problems = sup.check_configs(configs, secrets=secrets, session_key=key, dataset=dataset)
        for problem in problems:
            show(problem)
        cells = len(dataset.dataset.rows) * len(configs) * state["exp_repeats"]
        b_col, u_col = st.columns([1, 2], vertical_alignment="bottom")
        b_col.number_input("Budget (US dollars; 0: none)", min_value=0.0, step=1.0,
                           key="exp_budget", help=BUDGET_HELP)
        u_col.checkbox("Allow unknown prices (their calls count $0 toward the budget)",
                       key="exp_allow_unknown")
        planned = sup.budget_view(prices, state["exp_budget"], state["exp_allow_unknown"],
                                  configs=configs, rows=len(dataset.dataset.rows),
                                  repeats=state["exp_repeats"])
        st.caption(planned.estimate, help=ESTIMATE_HELP)
        if planned.problem:
            st.error(planned.problem, icon=":material/savings:")
        limits_refused = None
        try:
            if shown := sup.limits_text(sup.limits_from_state(state, configs), configs):
                st.caption(f"Limits: {shown}.")
        except ValueError as exc:
            limits_refused = str(exc)
            st.error(f"Limits: {exc}.")
        if st.button(f"Start experiment ({cells} cells)", key="exp_start", type="primary",
                     icon=":material/play_arrow:",
                     disabled=any(p.level == "error" for p in problems)
                     or planned.problem is not None or limits_refused is not None):
            started, problem = sup.new_experiment(
                store, ds, ds_version, configs, repeats=state["exp_repeats"],
                name=state["exp_name"], models=models)
            show(problem)
            if started is not None:
                state["exp_pick"] = started.experiment_id
                experiments = store.list_experiments()

# -- 3. the experiment: live progress, Stop, Resume, retries, Delete
show(state.pop("exp_message", None))
if not experiments:
    st.stop()
st.subheader("Experiment")
by_id = {e.experiment_id: e for e in experiments}
if (requested := state.pop(sup.OPEN_EXPERIMENT, None)) is not None:
    found = sup.find_experiment(store, requested)  # a link's id may be a prefix
    if found.target_id is not None:
        state["exp_pick"] = found.target_id
    else:
        state.pop("exp_pick", None)  # never another experiment in the place of the linked one
    state["exp_link_problem"] = found.problem
elif state.get("exp_pick") is not None:
    state.pop("exp_link_problem", None)  # one was picked (or started) since
picked_exp = state.get("exp_pick")
if picked_exp not in by_id and (linked := store.get_experiment(picked_exp or "")) is not None:
    by_id = {linked.experiment_id: linked, **by_id}  # older than the list shows
if state.get("exp_pick") not in by_id:
    state.pop("exp_pick", None)  # deleted since
if exp_link_problem := state.get("exp_link_problem"):
    st.warning(exp_link_problem, icon=":material/link_off:")
exp_id = st.selectbox("Experiment", list(by_id), key="exp_pick",
                      index=None if exp_link_problem else 0,
                      placeholder="Pick an experiment",
                      format_func=lambda eid: sup.experiment_label(by_id[eid]),
                      label_visibility="collapsed")
if exp_id is None:
    st.stop()
sup.show_link(state, st.query_params, "experiment", exp_id)  # the address bar links to it
link = sup.link_for("experiment", exp_id)
st.caption(f"Link to this experiment: [{link}]({link}) (or copy the address bar)")
stopping = not sup.wait_experiment_inactive(exp_id, timeout_s=5.0) and not started
experiment = store.get_experiment(exp_id) or by_id[exp_id]
results = experiment_results(store, exp_id, verdicts=False)  # the tabs that need them read them
failed = sup.failed_cells(results)
labels = [sup.config_column(results, i) for i in range(len(experiment.configurations))]

stop_col, resume_col, delete_col, retry_col, retry_btn = st.columns(
    [1, 1, 1, 3, 1], vertical_alignment="bottom")
queue = sup.queue_view(store, exp_id)
resume_refusal: str | None = None
resume_slot = resume_col.empty()
if queue is not None and queue.active and not sup.experiment_active(exp_id) and not started:
    resume_refusal = ("Its cells are queued or running on the DBOS queues "
                                        "(another process drives it): Stop it first.")
resume = resume_slot.button("Resume", key="exp_resume", icon=":material/replay:",
                            disabled=not sup.can_resume(experiment) or started is not None
                            or resume_refusal is not None,
                            help=resume_refusal or RESUME_HELP)
retry = None
if failed:
    picked = retry_col.selectbox("Failed cell", failed, key="exp_retry_pick",
                                 format_func=lambda k: sup.cell_label(results, k))
    if retry_btn.button("Retry cell", key="exp_retry", icon=":material/restart_alt:"):
        retry = picked
running = started is not None or resume or retry is not None
active = running or sup.experiment_active(exp_id)
# Queued or running on the engine, driven by another process (`eval`, a tab of another app):
# Stop cancels its cells there.
elsewhere = not active and queue is not None and queue.active
stop_slot = stop_col.empty()
if elsewhere:
    stop_slot.button("Stop", key="exp_stop_engine", icon=":material/stop:",
                     on_click=stop_elsewhere, args=(exp_id,),
                     help="Runs in another process: cancels its queued and running cells on "
                     "the DBOS queues; Resume queues them again.")
else:
    stop_slot.button("Stop", key="exp_stop", icon=":material/stop:", disabled=not active,
                     on_click=sup.stop_experiment, args=(exp_id,),
                     help="Stops the running cells; Resume continues them on their threads."
                     if active else "This experiment is not running in this session.")
with delete_col.popover("Delete", icon=":material/delete:", disabled=active or stopping,
                       help="Stop the experiment before deleting it." if active or stopping
                       else "Delete this experiment; its runs stay in Review."):
    st.markdown(f"Delete **{experiment.name}** and its {len(results.cells)} cells? Their runs "
                "stay in Review. This cannot be undone.")
    st.button("Delete experiment", key="exp_delete", type="primary", icon=":material/delete:",
              on_click=delete, args=(experiment,))
if not active and experiment.status != "finished":
    resumed = sup.budget_view(prices, state.get("exp_budget"), state.get("exp_allow_unknown",
                                                                            False),
                              configs=experiment.configurations, store=store,
                              experiment=experiment)
    kept = (f" · budget kept with it: {sup.format_dollars(experiment.budget['max_usd'])}"
            if experiment.budget else "")
    try:
        limited = sup.limits_text(sup.limits_from_state(state, experiment.configurations),
                                  experiment.configurations)
        limited = f" · limits: {limited}" if limited else ""
    except ValueError as exc:
        limited = f" · limits refused: {exc}"
    st.caption(f"Resume: {resumed.estimate.removeprefix('Estimate: ')}{kept}{limited}")
    if resume_refusal:
        st.caption(f"Resume is off: {resume_refusal}")
else:
    resumed = None
queue_slot = st.empty() if queue is not None else None
if queue_slot is not None and queue is not None:
    draw_queue(queue_slot, queue)
if stopping:
    st.info("This experiment is still stopping (or running in another tab). Refresh in a moment.")
if retry is not None:
    retry_cell(store, exp_id, retry)
if running:
    live(exp_id, labels, experiment.configurations,
         budget=(planned.budget if started is not None
                 else resumed.budget if resume and resumed else None),
         queue_slot=queue_slot)
    if queue_slot is not None:
        draw_queue(queue_slot, sup.queue_view(store, exp_id))  # as the run left it
    stop_slot.button("Stop", key="exp_stop_idle", icon=":material/stop:", disabled=True,
                     help="This experiment is not running in this session.")
    results = experiment_results(store, exp_id, verdicts=False)
    experiment = results.experiment
    resume_slot.button("Resume", key="exp_resume_after", icon=":material/replay:",
                       disabled=not sup.can_resume(experiment), help=RESUME_HELP)

# -- 4. results: only the open tab is computed (a big experiment's tables take time)
st.caption(f"{experiment.status} · {results.ended()}/{len(results.cells)} cells ended · dataset "
           f"{experiment.dataset_name} v{experiment.dataset_version} · "
           f"{experiment.repeats} repeat(s) · id {exp_id}")
grid_tab, summary_tab, criteria_tab, compare_tab, export_tab = st.tabs(
    ["Grid", "Summary", "Per criterion", "Compare", "Export"], key="exp_tab", on_change="rerun")
if grid_tab.open:
    with grid_tab:
        only = st.toggle("Only rows where the configurations disagree",
                         key=f"exp_disagree_{exp_id}", disabled=len(labels) < 2,
                         help="Rows satisfied under some configurations and not others.")
        grid = sup.shown_grid(sup.results_grid(results), only_disagreements=only)
        st.caption(f"{len(grid.table)} row(s) × configurations: final status (green "
                   "satisfied, yellow not met at the cap, red failed or broken, blue "
                   "unfinished), passes, grader tokens, time. Select a cell to read its answer "
                   "here, beside another configuration's.")
        chosen = st.dataframe(sup.styled(grid), hide_index=True, width="stretch",
                              on_select="rerun", selection_mode="single-cell",
                              key=f"exp_grid_{exp_id}_{only}",
                              height=min(600, 38 + 35 * max(len(grid.table), 1)))
        if (picked := sup.picked_position(chosen, grid)) is not None:
            row, column = picked
            others = [c for c in sup.config_columns(grid) if c != column]
            st.markdown(f"**{sup.row_label(grid, row)}** side by side")
            other = st.selectbox("Beside", others, key=f"exp_beside_{exp_id}",
                                 disabled=not others) if others else None
            columns = [column, *([other] if other else [])]
            for place, name in zip(st.columns(len(columns)), columns, strict=True):
                view = sup.cell_view(store, grid, row, name)
                with place.container(border=True, key=f"exp_cell_view_{len(columns)}_{name[:2]}"):
                    st.markdown(f"**{name}**  \n{view.headline}")
                    st.caption(view.status)
                    st.markdown(sup.answer_markdown(view.answer) or "_(no answer yet)_")
                    st.dataframe(view.verdicts, hide_index=True, width="stretch")
                    if view.run_id and st.button("Open in Review", key=f"exp_open_{name}",
                                                 icon=":material/open_in_new:"):
                        state["open_request"] = view.run_id  # Review's run picker takes it
                        st.switch_page("pages/review.py")
if summary_tab.open:
    with summary_tab:
        costs = sup.experiment_costs(store, prices, experiment)
        summary = sup.shown_summary(experiment_results(store, exp_id).summary(costs))
        st.caption(f"Cost: {sup.format_dollars(costs.total)}, priced from the recorded tokens "
                   "at the session's prices (sidebar, Cost).")
        st.dataframe(sup.shown_frame(summary), hide_index=True, width="stretch",
                     key="exp_summary", column_config=sup.column_labels(summary))
if criteria_tab.open:
    with criteria_tab:
        st.caption("Per configuration and criterion: pass rate at each cell's first grader pass "
                   "and at its last, and the mean passes needed to fix it.")
        per_criterion = experiment_results(store, exp_id).criteria()
        st.dataframe(sup.shown_frame(per_criterion), hide_index=True, width="stretch",
                     column_config=sup.column_labels(per_criterion))
if compare_tab.open:
    with compare_tab:
        if len(labels) < 2:
            st.info("Compare needs two configurations: start an experiment with more than one.")
        else:
            a_col, b_col = st.columns(2)
            a = a_col.selectbox("A", range(len(labels)), key="exp_cmp_a",
                                format_func=labels.__getitem__)
            b = b_col.selectbox("B", range(len(labels)), index=1, key="exp_cmp_b",
                                format_func=labels.__getitem__)
            view = sup.comparison_view(results, a, b)
            st.markdown(view.headline)
            st.markdown(sup.compare_sentence(
                results, sup.experiment_costs(store, prices, experiment), a, b))
            st.caption(view.meaning)
            st.dataframe(view.flips, hide_index=True, width="stretch", key="exp_flips",
                         column_config=sup.column_labels(view.flips))
            draw_head_to_head(store, sup.experiment_head_to_head(store, results, a, b, labels),
                              key="exp")
if export_tab.open:
    with export_tab:
        st.caption("One row per dataset row × configuration × repeat × pass × criterion, with "
                   "the dataset's columns; formula-safe CSV.")
        e1, e2, e3 = st.columns(3)
        e1.download_button("Download experiment CSV", sup.export_data(store, exp_id, "csv", prices),
                           f"experiment-{exp_id[:8]}.csv", "text/csv", key="exp_download_csv",
                           on_click="ignore", icon=":material/download:")
        e2.download_button("Download experiment JSON",
                           sup.export_data(store, exp_id, "json", prices),
                           f"experiment-{exp_id[:8]}.json", "application/json",
                           key="exp_download_json", on_click="ignore",
                           icon=":material/download:")
        e3.download_button("Download summary CSV", sup.summary_csv(store, exp_id, prices),
                           f"experiment-{exp_id[:8]}-summary.csv", "text/csv",
                           key="exp_download_summary", on_click="ignore",
                           icon=":material/download:")
