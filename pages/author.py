"""Author: prompt, rubric (text and table, kept in sync), lint, grader options, rubric library."""

from __future__ import annotations

import streamlit as st

from rubric_core import app_support as sup
from rubric_core.grader import GRADER_SYSTEM_PROMPT
from rubric_core.rubric import parse_criteria

state = st.session_state
if "store" not in state:
    # Opened without app.py (Streamlit's legacy pages/ mode on a fresh server): go through it.
    state["_wanted_page"] = "pages/author.py"
    st.switch_page("app.py")
store = state.get("store")

st.header("Author", divider="gray")
examples = sup.example_choices()
ex_col, btn_col = st.columns([4, 1], vertical_alignment="bottom")
ex_col.selectbox("Start from a bundled example", list(examples), key="example_select",
                 format_func=lambda name: examples.get(name, name))
btn_col.button("Load example", key="load_example", on_click=sup.load_example_into,
               args=(state,), icon=":material/download:", width="stretch")

if (notice := state.pop("author_notice", None)) is not None:
    getattr(st, notice.level)(notice.text)

st.text_area("Prompt", key="prompt", height=120, on_change=sup.leave_example_if_edited,
             args=(state,),
             placeholder="What should the worker do? e.g. Write a haiku about spring.")
# Never hidden while set: it is sent with every run.
system_set = bool(state["worker_system_prompt"].strip())
with st.expander("Worker system prompt" + (" (set: sent with the run)" if system_set
                                           else " (optional)"), expanded=system_set):
    st.text_area("Worker system prompt", key="worker_system_prompt", height=100,
                 label_visibility="collapsed")

rubric = state["rubric_text"]
text_col, table_col = st.columns(2)
text_col.text_area("Rubric — one criterion per line", key="rubric_text", height=220,
                   placeholder="- The poem has three lines\n- Lines follow a 5-7-5 pattern")
editor = sup.editor_key(rubric)
with table_col:
    st.caption(f"The loop will grade these {len(parse_criteria(rubric))} criteria "
               "(edit, add or delete rows; the text follows):")
    st.data_editor(sup.criteria_frame(rubric), key=editor, num_rows="dynamic",
                   on_change=sup.sync_rubric_from_editor, args=(state, editor, rubric),
                   hide_index=True, width="stretch",
                   column_config={"criterion": st.column_config.TextColumn("Criterion")})

if (welcome := sup.welcome_message(state["prompt"], rubric)) is not None:
    st.info(welcome.text, icon=":material/waving_hand:")
else:
    lint = sup.lint_for_ui(rubric, state["grader_model"], state["grader_tools"])
    for message in lint:
        getattr(st, message.level)(message.text)
    if rubric.strip() and not lint:
        st.success("The rubric looks good: no lint findings.", icon=":material/check:")

st.subheader("Grader")
st.multiselect("Evidence tools the grader may call", key="grader_tools",
               options=sup.tool_options(state["example_name"], state["grader_tools"]))
for message in sup.sandbox_messages(state["grader_tools"], state["example_name"]):
    getattr(st, message.level)(message.text, icon=":material/shield:")
st.text_area("Custom grader system prompt (optional; replaces the built-in one)",
             key="grader_system_prompt", height=100)
with st.expander("Built-in grader system prompt (for reference)"):
    st.code(GRADER_SYSTEM_PROMPT, language=None, wrap_lines=True)

st.subheader("Rubric library")
if store is None:
    st.info("The rubric library needs the database, which cannot be used (see the sidebar).")
else:
    save_col, load_col = st.columns(2)
    with save_col:
        st.text_input("Name", key="rubric_name", placeholder="e.g. haiku-basics")
        if st.button("Save rubric", key="save_rubric", icon=":material/save:"):
            saved = sup.save_library_rubric(store, state["rubric_name"], rubric,
                                            sup.settings_from_state(state))
            getattr(st, saved.level)(saved.text)
    with load_col:
        saved_rubrics = {r["name"]: r["latest_version"] for r in store.list_rubrics()}
        name = st.selectbox("Saved rubrics", list(saved_rubrics), key="library_select",
                            index=None, placeholder="No rubric chosen")
        versions = [v["version"] for v in store.rubric_versions(name)][::-1] if name else []
        st.selectbox("Version", versions, key="library_version")
        st.button("Load rubric", key="load_rubric", on_click=sup.load_library_rubric,
                  args=(state, store), disabled=not name, icon=":material/upload:")
