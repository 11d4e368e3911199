"""The Head to head view, drawn by Review and Experiments: judge A against B in both orders.

Not a page (`app.py` lists the pages): the one drawing of `rubric_core.app_support.pairwise`'s
data that both pages show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from rubric_core import app_support as sup

if TYPE_CHECKING:
    from rubric_core.store import Store

REASON_HEADERS = {
    "pair": st.column_config.TextColumn("Pair"),
    "criterion": st.column_config.TextColumn("Criterion", width="medium"),
    "a_first": st.column_config.TextColumn("A shown first", help="The winner, in A/B terms"),
    "reason_a_first": st.column_config.TextColumn("Reason (A shown first)", width="large"),
    "b_first": st.column_config.TextColumn("B shown first", help="The winner, in A/B terms"),
    "reason_b_first": st.column_config.TextColumn(
        "Reason (B shown first)", width="large",
        help="The grader names the answers as it was shown them: here its 'answer A' is B"),
    "result": st.column_config.TextColumn("Result"),
    "error": st.column_config.TextColumn("Why not judged", width="medium"),
}


def draw_head_to_head(store: Store, what: sup.HeadToHead, *, key: str) -> None:
    """The Judge head to head button for `what`, the judgement it made, and the stored ones."""
    state = st.session_state
    with st.container(border=True, key=f"{key}_h2h"):
        st.markdown("**Head to head** — is B better than A? Per criterion, judged twice: A "
                    "shown first, then B shown first.")
        st.caption(f"A = {what.label_a} · B = {what.label_b} · with the sidebar's grader "
                   f"(`{state.get('grader_model', 'rules')}`): {2 * what.count} grader "
                   f"call(s) for {what.count} pair(s). The flip rate is the share of "
                   "criterion judgements whose two orders disagree (position bias).")
        if st.button("Judge head to head", key=f"{key}_h2h_judge", disabled=not what.count,
                     icon=":material/swap_horiz:", help=what.why_none or None):
            with st.spinner("Judging in both orders …"):
                judged, message = sup.judge_head_to_head(store, what, state,
                                                         sup.safe_mapping(st.secrets))
            if judged is not None:
                state[f"{key}_h2h_open"] = judged
            getattr(st, message.level)(message.text)
        listed, ids = sup.pairwise_list(store)
        with st.expander(f"Stored head-to-head judgements ({len(ids)})"):
            chosen = st.dataframe(listed, hide_index=True, width="stretch", on_select="rerun",
                                  selection_mode="single-row", key=f"{key}_h2h_list")
            if (picked := sup.picked_row(chosen, ids)) is not None:
                state[f"{key}_h2h_open"] = picked
            st.download_button("Download the list (CSV)", sup.pairwise_list_csv(store),
                               "head-to-head.csv", "text/csv", key=f"{key}_h2h_list_csv",
                               on_click="ignore", icon=":material/download:")
        if (opened := state.get(f"{key}_h2h_open")) in ids:
            view = sup.head_to_head_view(store, opened, sup.session_prices(state).prices)
            st.markdown(view.headline)
            st.dataframe(view.tallies, hide_index=True, width="stretch", key=f"{key}_h2h_tally",
                         column_config={"Flip rate": st.column_config.NumberColumn(
                             "Flip rate", format="%.2f")})
            st.dataframe(view.reasons, hide_index=True, width="stretch",
                         key=f"{key}_h2h_reasons", column_config=REASON_HEADERS)
            st.download_button("Download CSV", view.csv, f"head-to-head-{opened[:8]}.csv",
                               "text/csv", key=f"{key}_h2h_csv", on_click="ignore",
                               icon=":material/download:")
