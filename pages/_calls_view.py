"""The Calls view, drawn by Run and Review: a run's model calls, and one call's messages.

Not a page (`app.py` lists the pages): the one drawing of `rubric_core.app_support.calls`'s data
that both pages show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from rubric_core import app_support as sup

if TYPE_CHECKING:
    from rubric_core.store import Store


def draw_calls(store: Store, run_id: str, *, key: str) -> None:
    """The run's model calls per pass, and one call's messages and reply; widget keys from key."""
    calls = store.calls(run_id)
    st.caption(sup.calls_summary(calls))
    if not calls:
        return
    frame = sup.calls_frame(calls).rename(columns=sup.CALL_HEADERS)
    shown = frame.astype(object).where(frame.notna(), "—")  # not reported: a dash, not "None"
    st.dataframe(shown, hide_index=True, width="stretch", key=f"{key}_calls")
    index = st.selectbox("Call", range(len(calls)), key=f"{key}_call_{run_id}",
                         format_func=lambda i: sup.call_label(calls, i))
    detail = sup.call_detail(calls[index])
    st.caption(detail.facts)
    for note in detail.notes:
        st.info(note)
    for message in detail.messages:
        st.markdown(f"**{message.heading}**")
        st.text(message.text)
    if detail.reply is not None:
        st.markdown(f"**Reply · {detail.reply.heading}**")
        st.text(detail.reply.text)
