"""Rubric Studio — the Streamlit app's router and shared sidebar."""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="Rubric Studio", page_icon="✅", layout="wide")
st.title("Rubric Studio")
st.write("Declare what 'done' means as a rubric, then watch an agent revise until it passes.")
