"""Rubric lab: label fixed answers, re-grade them with rubric versions, fix weak criteria."""

from __future__ import annotations

import os

import streamlit as st

from rubric_core import app_support as sup
from rubric_core.http_retry import SharedBackoff
from rubric_core.lab import BUNDLED_RUBRIC_NAME, compare_configs, criterion_health
from rubric_core.types import RUN_STATUSES

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/lab.py"
    st.switch_page("app.py")
store = state.get("store")
secrets = sup.safe_mapping(st.secrets)
key = sup.session_key(state)
sup.keep_lab_form(state)
backoff = SharedBackoff()  # one per script run: the re-grade it starts shares it
models = sup.app_models(secrets, session_key=key, sidebar_base_url=state.get("base_url"),
                        token_delay_s=0.0, backoff=backoff)


def show(message: sup.UiMessage | None) -> None:
    if message is not None:
        getattr(st, message.level)(message.text)


def run(job_id: str, *, retry_errors: bool = False) -> None:
    state["lab_message"] = sup.start_regrade(store, job_id, models=models, backoff=backoff,
                                             concurrency=state["lab_concurrency"],
                                             retry_errors=retry_errors)


def start(set_name: str, version: int) -> None:
    configs, _ = sup.grader_configs_from_state(state, store, secrets=secrets, session_key=key)
    job, problem = sup.new_regrade(store, set_name, version, configs, models=models)
    state["lab_message"] = problem
    if job is not None:
        state["lab_job"] = job.job_id
        run(job.job_id)


def stop(job_id: str) -> None:
    sup.stop_regrade(job_id)
    sup.wait_regrade(job_id, timeout_s=5.0)  # the page then shows it stopped


def label(view: sup.LabelView, set_name: str, version: int, item_id: str, word: str) -> None:
    criterion = state["lab_crit"]
    state["lab_label_msg"] = sup.record_verdict(store, set_name, version, item_id, criterion,
                                                state["labeller"], word)
    if state["lab_label_msg"].level != "error":
        state["lab_item"], state["lab_crit"] = sup.label_after(view, item_id, criterion)


def move(view: sup.LabelView, item_id: str, step: int) -> None:
    state["lab_item"], state["lab_crit"] = sup.label_neighbour(view, item_id, step), None


def accept(job_id: str, config_index: int, criterion: str, number: int) -> None:
    index, state["lab_refine_msg"] = sup.accept_suggestion(
        store, job_id, config_index, criterion, state[f"lab_rewrite_{number}"])
    if index is not None:
        state["lab_after"] = (job_id, config_index, index, criterion)
        state.pop("lab_suggestions", None)
        run(job_id)


st.header("Rubric lab", divider="gray")
st.caption("The answers stay fixed while the rubric changes: label answers, re-grade them with "
           "rubric versions (only the grader runs), see which criteria judge badly, reword them "
           "and check that the rewording judges better.")
if store is None:
    st.error(state.get("store_error") or "The database cannot be used.")
    st.stop()

# -- 1. answer sets
sets = store.list_answer_sets()
with st.expander(f"Answer sets ({len(sets)} stored)", expanded=not sets):
    picked = None
    bundled_tab, upload_tab, exp_tab, runs_tab = st.tabs(
        ["Bundled", "Upload", "From an experiment", "From stored runs"])
    with bundled_tab:
        st.caption("32 answers to one question, every criterion labelled by two people: the "
                   "whole loop runs offline with the `rules` grader and the `demo` refiner.")
        if st.button("Load the bundled labelled set", key="lab_load_bundled", type="primary",
                     icon=":material/dataset:"):
            message, picked = sup.import_bundled_answers(store)
            show(message)
            state[sup.lab_config_key(0, "rubric")] = BUNDLED_RUBRIC_NAME
            state.pop(sup.lab_config_key(0, "version"), None)
    with upload_tab:
        st.caption("CSV or JSONL with `request` and `answer`, optional `id` and `rubric`, and "
                   "people's verdicts as `label:<criterion>` or `label@<person>:<criterion>` "
                   "columns (pass/fail). A bad file is refused whole; nothing is stored.")
        upload = st.file_uploader("Answer file", type=["csv", "jsonl"], key="lab_upload")
        n_col, l_col, b_col = st.columns([2, 2, 1], vertical_alignment="bottom")
        n_col.text_input("Set name", key="lab_upload_name", placeholder="the file's name")
        l_col.text_input("Whose are the label: columns", key="lab_upload_labeller",
                         placeholder="uploaded")
        if b_col.button("Store answer set", key="lab_store_upload", icon=":material/upload:",
                        disabled=upload is None):
            message, picked = sup.import_answer_file(
                store, upload.getvalue(), file_name=upload.name, name=state["lab_upload_name"],
                labeller=state["lab_upload_labeller"])
            show(message)
    with exp_tab:
        experiments = {e.experiment_id: e for e in store.list_experiments()}
        if not experiments:
            st.info("No experiment yet: run one on the Experiments page, then take its answers.")
        else:
            e_col, p_col, b_col = st.columns([3, 1, 1], vertical_alignment="bottom")
            exp_id = e_col.selectbox("Experiment", list(experiments), key="lab_exp_pick",
                                     format_func=lambda e: sup.experiment_label(experiments[e]))
            every = p_col.checkbox("Every pass", key="lab_exp_every_pass",
                                   help="Each pass's answer, not only each cell's final one.")
            if b_col.button("Take its answers", key="lab_store_exp", icon=":material/input:"):
                message, picked = sup.import_experiment_answers(
                    store, exp_id, name=experiments[exp_id].name + " answers", every_pass=every)
                show(message)
    with runs_tab:
        m_col, s_col, t_col, b_col = st.columns([2, 1, 2, 1], vertical_alignment="bottom")
        m_col.text_input("Model", key="lab_runs_model", placeholder="any")
        s_col.selectbox("Status", ["", *sorted(RUN_STATUSES)], key="lab_runs_status",
                        format_func=lambda s: s or "any")
        t_col.text_input("Text in title, prompt or rubric", key="lab_runs_text")
        if b_col.button("Take final answers", key="lab_store_runs", icon=":material/input:"):
            message, picked = sup.import_run_answers(
                store, name="runs", model=state["lab_runs_model"],
                status=state["lab_runs_status"], text=state["lab_runs_text"])
            show(message)
    if picked:
        state["lab_set"] = picked
        sets = store.list_answer_sets()
    if sets:
        st.dataframe(sup.answer_sets_frame(sets), hide_index=True, width="stretch")

if not sets:
    st.info("Store an answer set first: the bundled labelled set above runs with no key.")
    st.stop()
s_col, v_col, j_col = st.columns([2, 1, 4])
set_name = s_col.selectbox("Answer set", [s.name for s in sets], key="lab_set")
versions = [v.version for v in store.answer_set_versions(set_name)][::-1]
version = v_col.selectbox("Version", versions, key=f"lab_set_version_{set_name}")
jobs = {j.job_id: j for j in store.list_regrade_jobs()
        if j.set_name == set_name and j.set_version == version}
if state.get("lab_job") not in jobs:
    state["lab_job"] = next(iter(jobs), None)
job_id = j_col.selectbox("Re-grade", list(jobs), key="lab_job", disabled=not jobs,
                         format_func=lambda j: sup.regrade_label(jobs[j]),
                         placeholder="none yet: start one in the Re-grade tab")
show(state.pop("lab_message", None))

# -- 2. the re-grade: progress (polled while it runs here), Stop, Resume, retry
if job_id is not None:
    view = sup.regrade_view(store, job_id)
    stop_col, resume_col, retry_col, _ = st.columns([1, 1, 2, 4])
    stop_col.button("Stop", key="lab_stop", icon=":material/stop:", on_click=stop,
                    args=(job_id,), disabled=not view.running_here,
                    help="Stops the re-grade; what was recorded is kept.")
    busy = view.running_here or view.running_elsewhere
    resume_col.button("Resume", key="lab_resume", icon=":material/replay:", on_click=run,
                      args=(job_id,), disabled=busy or view.complete,
                      help="Grades only the answers not recorded yet.")
    retry_col.button(f"Retry failed gradings ({view.errors})", key="lab_retry",
                     icon=":material/restart_alt:", on_click=run, args=(job_id,),
                     kwargs={"retry_errors": True}, disabled=busy or not view.errors)

    def draw_progress(now: sup.RegradeView) -> None:
        for event in now.progress:
            st.progress(*sup.regrade_progress_text(event))
        show(now.message)
        st.caption(f"{now.job.status} · {now.job.set_name} v{now.job.set_version} · id {job_id}")

    if view.running_here or view.running_elsewhere:
        # Polled while it runs, here or in another process (the CLI, another server).
        @st.fragment(run_every=1.0 if view.running_here else 2.0)
        def progress() -> None:
            now = sup.regrade_view(store, job_id)
            draw_progress(now)
            if (now.running_here, now.running_elsewhere) != (view.running_here,
                                                             view.running_elsewhere):
                st.rerun()  # it started or ended: redraw the buttons and the tables

        progress()
    else:
        # Drawn without a fragment: a full run that does not register the polling fragment
        # makes Streamlit drop a poll already on its way. Streamlit 1.67 ran such a late
        # fragment run after the redraw, and the browser then lost everything below the
        # fragment (the tabs) until the next click.
        draw_progress(view)

label_tab, regrade_tab, health_tab, compare_tab, refine_tab, export_tab = st.tabs(
    ["Label", "Re-grade", "Health", "Compare", "Refine", "Export"], key="lab_tab",
    on_change="rerun")
if label_tab.open:
    with label_tab:
        n_col, f_col = st.columns([1, 3], vertical_alignment="bottom")
        n_col.text_input("Your name", key="labeller", max_chars=100)
        f_col.segmented_control("Show", sup.LABEL_SHOW, key="lab_show", required=True)
        if job_id is not None:
            rubric = jobs[job_id].configurations[-1].rubric  # the criteria it was graded on
        else:
            typed, _ = sup.grader_configs_from_state(state, store, secrets=secrets,
                                                     session_key=key)
            rubric = typed[0].rubric if typed else ""
        lv = sup.label_view(store, set_name, version, labeller=state["labeller"], rubric=rubric,
                            show=state["lab_show"], job_id=job_id)
        if not lv.item_ids or not lv.criteria:
            st.info("Nothing to label here: pick another Show, or give a rubric in the "
                    "Re-grade tab (its criteria are the ones labelled).")
        else:
            if state.get("lab_item") not in lv.item_ids:
                state["lab_item"] = lv.item_ids[0]
            if state.get("lab_crit") not in lv.criteria:
                state["lab_crit"] = lv.criteria[0]
            item_id = state["lab_item"]
            item = store.answer_items(set_name, version, ids=[item_id])[0]
            st.markdown(f"**Answer {lv.item_ids.index(item_id) + 1} of {len(lv.item_ids)}** · "
                        f"id `{item_id}`")
            st.caption(f"Request: {item.request}")
            with st.container(border=True, key="lab_answer"):
                st.markdown(sup.answer_markdown(item.answer))
            st.radio("Criterion", lv.criteria, key="lab_crit",
                     captions=[lv.caption(item_id, c, state["labeller"]) for c in lv.criteria])
            cols = st.columns(5)
            for col, word, icon, shortcut in zip(
                    cols[:3], sup.LABEL_VERDICTS, (":material/check:", ":material/close:",
                                                   ":material/skip_next:"), ("P", "F", "S"),
                    strict=True):
                col.button(word.capitalize(), key=f"lab_{word}", icon=icon, shortcut=shortcut,
                           on_click=label, args=(lv, set_name, version, item_id, word),
                           type="primary" if word == "pass" else "secondary")
            cols[3].button("Previous", key="lab_prev", icon=":material/arrow_back:",
                           shortcut="Left", on_click=move, args=(lv, item_id, -1))
            cols[4].button("Next", key="lab_next", icon=":material/arrow_forward:",
                           shortcut="Right", on_click=move, args=(lv, item_id, 1))
            show(state.pop("lab_label_msg", None))
            st.caption("Keys: P pass, F fail, S skip (removes your verdict), ← → answers. A "
                       "verdict moves to the next criterion, then the next answer.")
if regrade_tab.open:
    with regrade_tab:
        c_col, k_col = st.columns(2)
        c_col.number_input("Configurations", 1, sup.MAX_LAB_CONFIGS, key="lab_cfg_count")
        k_col.number_input("Concurrency (gradings at once)", 1, sup.MAX_CONCURRENCY,
                           key="lab_concurrency")
        library = [sup.TYPED_RUBRIC, *(r["name"] for r in store.list_rubrics())]
        for i in range(state["lab_cfg_count"]):
            with st.container(border=True, key=f"lab_cfg_{i}"):
                st.markdown(f"**Configuration {i + 1}**")
                r_col, v_col, g_col = st.columns([3, 1, 3])
                if state[sup.lab_config_key(i, "rubric")] not in library:
                    state[sup.lab_config_key(i, "rubric")] = sup.TYPED_RUBRIC
                name = r_col.selectbox("Rubric", library, key=sup.lab_config_key(i, "rubric"))
                if name == sup.TYPED_RUBRIC:
                    st.text_area("Rubric — one criterion per line", height=110,
                                 key=sup.lab_config_key(i, "text"))
                else:
                    numbers = [v["version"] for v in store.rubric_versions(name)][::-1]
                    if state.get(sup.lab_config_key(i, "version")) not in numbers:
                        state[sup.lab_config_key(i, "version")] = numbers[0]
                    number = v_col.selectbox("Version", numbers,
                                             key=sup.lab_config_key(i, "version"))
                    st.code(store.load_rubric(name, number), language=None)
                choices = sup.model_options("grader", env=os.environ, secrets=secrets,
                                            base_url=state["base_url"],
                                            current=state[sup.lab_config_key(i, "grader")])
                g_col.selectbox("Grader model", [c.value for c in choices],
                                key=sup.lab_config_key(i, "grader"), accept_new_options=True,
                                format_func=lambda v, c=choices: sup.model_label(c, v))
                rp_col, cs_col, fs_col = st.columns(3, vertical_alignment="bottom")
                rp_col.number_input("Grader repeats", 1, sup.MAX_GRADER_REPEATS,
                                    key=sup.lab_config_key(i, "repeats"))
                cs_col.selectbox("Consensus", sup.CONSENSUS_MODES,
                                 key=sup.lab_config_key(i, "consensus"),
                                 disabled=state[sup.lab_config_key(i, "repeats")] < 2)
                fs_col.checkbox("Few-shot from people's verdicts",
                                key=sup.lab_config_key(i, "few_shot"),
                                help="Align's examples from this set's labels (never an "
                                     "answer's own).")
        configs, problems = sup.grader_configs_from_state(state, store, secrets=secrets,
                                                          session_key=key)
        for problem in problems:
            show(problem)
        answers = store.answer_set_info(set_name, version).item_count
        gradings = answers * sum(c.grader_repeats for c in configs)
        st.button(f"Start re-grade ({gradings} gradings)", key="lab_start", type="primary",
                  icon=":material/play_arrow:", on_click=start, args=(set_name, version),
                  disabled=bool(problems) or not configs)
if job_id is not None and health_tab.open:
    with health_tab:
        report = criterion_health(store, job_id)
        st.dataframe(sup.health_frame(report), hide_index=True, width="stretch",
                     key="lab_health")
        for health in report.flagged():
            st.markdown(f"- **{health.criterion}** ({health.config_label}): "
                        f"{', '.join(health.flags)}")
        st.caption("κ is Cohen's kappa between the grader and each person's verdicts (n pairs; "
                   "below 0.6 flags `disagrees`); people vs people κ is the ceiling a judge can "
                   "reach. `never_fails`/`always_fails` do not discriminate, `unstable`: repeats "
                   "disagree, `redundant`: the same verdicts as another criterion. No flag under "
                   "5 answers. Refine a flagged criterion in the Refine tab.")
        st.markdown("**Cost** — what each configuration's gradings cost, at the session's "
                    "prices (set or override one in the sidebar's Cost)")
        st.dataframe(sup.regrade_cost_frame(store, sup.session_prices(state).prices,
                                            view.job),
                     hide_index=True, width="stretch", key="lab_cost")
if job_id is not None and compare_tab.open:
    with compare_tab:
        labels = sup.regrade_config_labels(jobs[job_id])
        if len(labels) < 2:
            st.info("Compare needs two configurations: start a re-grade with two rubric "
                    "versions, or accept a rewrite in the Refine tab.")
        else:
            a_col, b_col = st.columns(2)
            a = a_col.selectbox("A", range(len(labels)), key="lab_cmp_a",
                                format_func=labels.__getitem__)
            b = b_col.selectbox("B", range(len(labels)), index=len(labels) - 1,
                                key="lab_cmp_b", format_func=labels.__getitem__)
            cmp = compare_configs(store, job_id, a, b)
            st.dataframe(sup.rubric_compare_frame(cmp), hide_index=True, width="stretch",
                         key="lab_compare")
            if cmp.only_a or cmp.only_b:
                st.caption(f"Only in A: {', '.join(cmp.only_a) or '—'} · only in B: "
                           f"{', '.join(cmp.only_b) or '—'}")
            if cmp.criteria:
                most = max(range(len(cmp.criteria)), key=lambda i: len(cmp.criteria[i].flips))
                shown = st.selectbox("Flipped verdicts of", [c.criterion_a for c in cmp.criteria],
                                     index=most, key="lab_cmp_criterion")
                st.caption(sup.kappa_change(cmp, shown))
                st.dataframe(sup.flips_frame(cmp, shown), hide_index=True, width="stretch",
                             key="lab_flips")
if job_id is not None and refine_tab.open:
    with refine_tab:
        labels = sup.regrade_config_labels(jobs[job_id])
        c_col, k_col, r_col = st.columns([2, 3, 2], vertical_alignment="bottom")
        config_index = c_col.selectbox("Configuration", range(len(labels)), key="lab_ref_cfg",
                                       index=len(labels) - 1, format_func=labels.__getitem__)
        flagged = {h.criterion: h for h in criterion_health(store, job_id).for_config(
            config_index) if h.flags}
        refiner = r_col.selectbox("Refiner model", sup.refiner_options(state),
                                  key="lab_refiner", accept_new_options=True,
                                  help="demo: the offline refiner (it knows the bundled set); "
                                       "or an LLM from the sidebar.")
        if not flagged:
            k_col.success("No criterion of this configuration is flagged.")
        else:
            criterion = k_col.selectbox(
                "Flagged criterion", list(flagged), key="lab_ref_crit",
                format_func=lambda c: f"{c} — {', '.join(flagged[c].flags)}")
            if st.button("Suggest a rewrite", key="lab_suggest", icon=":material/auto_fix:"):
                with st.spinner("Asking the refiner…"):
                    rewrites, message = sup.suggest_rewrite(
                        store, job_id, config_index, criterion, refiner, models=models,
                        base_url=state["base_url"] or None)
                state["lab_refine_msg"] = message
                state["lab_suggestions"] = ((job_id, config_index, criterion),
                                            [r.model_dump() for r in rewrites])
                for number, rewrite in enumerate(rewrites):
                    state[f"lab_rewrite_{number}"] = "\n".join(rewrite.criteria)
            where, suggestions = state.get("lab_suggestions") or (None, [])
            show(state.pop("lab_refine_msg", None))
            for number, rewrite in enumerate(suggestions if where == (
                    job_id, config_index, criterion) else []):
                with st.container(border=True, key=f"lab_suggestion_{number}"):
                    st.markdown(f"**{rewrite['kind']}** — {rewrite['rationale']}")
                    st.text_area("Criteria (one per line; edit before accepting)", height=80,
                                 key=f"lab_rewrite_{number}")
                    st.button("Accept", key=f"lab_accept_{number}", icon=":material/done_all:",
                              on_click=accept, args=(job_id, config_index, criterion, number))
        after = state.get("lab_after")
        if after and after[0] == job_id:
            st.markdown("**Before / after**")
            if sup.regrade_active(job_id):
                st.info("The accepted version is being graded on the same answers…")
            else:
                cmp = compare_configs(store, job_id, after[1], after[2])
                st.markdown(sup.kappa_change(cmp, after[3]))
                st.dataframe(sup.rubric_compare_frame(cmp), hide_index=True, width="stretch",
                             key="lab_before_after")
if job_id is not None and export_tab.open:
    with export_tab:
        st.caption("One row per configuration × answer × repeat × criterion, with people's "
                   "verdicts beside it; formula-safe CSV.")
        e1, e2 = st.columns(2)
        e1.download_button("Download re-grade CSV", sup.regrade_download(store, job_id, "csv"),
                           f"regrade-{job_id[:8]}.csv", "text/csv", key="lab_download_csv",
                           on_click="ignore", icon=":material/download:")
        e2.download_button("Download re-grade JSON", sup.regrade_download(store, job_id, "json"),
                           f"regrade-{job_id[:8]}.json", "application/json",
                           key="lab_download_json", on_click="ignore",
                           icon=":material/download:")
if job_id is None and not (label_tab.open or regrade_tab.open):
    st.info("Start a re-grade in the Re-grade tab: health, compare, refine and downloads need one.")
