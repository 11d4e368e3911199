"""Rubric Studio — the Streamlit app's router and shared sidebar (models, iterations, database).

Pages read the shared settings from ``st.session_state`` and the open database from
``st.session_state["store"]`` (None, with ``store_error`` set, when it cannot be used).
"""

from __future__ import annotations

import os
import time

import streamlit as st

from rubric_core import app_support as sup
from rubric_core import host_check, redact
from rubric_core.store import Store, StoreError, shown_location

st.set_page_config(page_title="Rubric Studio", page_icon="✅", layout="wide")
# Served without serve.py, the app would answer any Host name (DNS rebinding). AppTest sends no
# request headers; a real server always does.
if st.context.headers and not host_check.installed():
    st.error(host_check.NOT_INSTALLED, icon=":material/gpp_bad:")
    st.stop()


@st.cache_resource(show_spinner=False)
def _store(path: str) -> Store:
    # Safe to share across script threads: short-lived connections plus a locked saver.
    # A refused file raises, and cache_resource never caches a raise.
    return Store(path).open()


def _open_store(path: str) -> tuple[Store | None, str | None]:
    try:
        return _store(path), None
    except (StoreError, ValueError) as exc:
        return None, str(exc)


secrets = sup.safe_mapping(st.secrets)
# Whatever is shown, logged or stored is scrubbed of these (rubric_core.redact).
redact.install_log_redaction()
redact.register_secrets(secrets)
state = st.session_state
# Re-assigning keeps page widgets' values while another page is shown (Streamlit drops the
# state of widgets that were not drawn in a run).
defaults = {**sup.FORM_DEFAULTS, "base_url": sup.base_url_default(os.environ, secrets),
            "labeller": sup.default_labeller()}
for key, default in defaults.items():
    state[key] = state.get(key, default)
max_iterations, max_iterations_notice = sup.check_max_iterations(state["max_iterations"])
state["max_iterations"] = max_iterations

db_path = str(sup.resolve_db_path(state.get("db_path"), secrets))
store, store_error = _open_store(db_path)
state["store"] = store
state["store_error"] = sup.store_error_message(store_error) if store_error else None
# What was typed survives a reload (a draft in the database, its id in the URL), and a
# ?run= or ?experiment= link opens that run or experiment: in a new session, and whenever the
# URL names another than the page shows (the browser's Back and Forward keep the session).
draft_notice = sup.sync_draft(state, st.query_params, store) if store is not None else None
if (link := sup.follow_link(state, st.query_params)) is not None:
    state["_wanted_page"] = link.page

with st.sidebar:
    st.markdown("### Models")
    # The placeholder must not read as a value: empty means the provider's own endpoint.
    st.text_input(
        "OpenAI-compatible base URL", key="base_url",
        placeholder="empty: the provider's own endpoint",
        help="For local servers such as Ollama, vLLM, llama.cpp or LM Studio; used by "
        "openai-compatible:<model> and openai:<model>. Leave empty for api.openai.com. Its "
        "models are listed below once it answers.",
    )
    if not sup.base_url_trusted(state["base_url"], secrets):
        st.text_input(
            "API key for this base URL (optional)", key="session_api_key", type="password",
            help="Sent only to the base URL above and kept in this browser session's memory: "
            "never stored, exported or logged. The server's own keys are never sent to a base "
            "URL typed here.",
        )
        redact.register_secret(state.get("session_api_key"))
    served = sup.server_models_for(
        state, state["base_url"], now=time.monotonic(),
        api_key=sup.server_key(state["base_url"], secrets=secrets, env=os.environ,
                               session_key=sup.session_key(state)))
    if served.models:
        st.caption(f"{len(served.models)} model(s) offered by this server, listed below as "
                   "openai-compatible:<name>.")
    elif served.problem:
        st.caption(f"No model list from this base URL: {served.problem}. Type a model as "
                   "openai-compatible:<name>.")
    unavailable: dict[str, str | None] = {}
    for role, key, label in (("worker", "worker_model", "Worker model"),
                             ("grader", "grader_model", "Grader model")):
        choices = sup.model_options(role, env=os.environ, secrets=secrets,
                                    base_url=state["base_url"], current=state[key],
                                    server_models=served.models)
        st.selectbox(
            label, [c.value for c in choices], key=key, accept_new_options=True,
            format_func=lambda v, c=choices: sup.model_label(c, v),
            help="Pick one, or type any provider:model string (e.g. anthropic:claude-haiku-4-5).",
        )
        problem = sup.model_problem(state[key], base_url=state["base_url"], secrets=secrets,
                                    session_key=state.get("session_api_key"))
        if problem:
            st.warning(f"{label}: {problem}", icon=":material/warning:")
        unavailable.update({c.value: c.reason for c in choices if c.reason})
    if unavailable:  # the dropdown is too narrow to read a reason: here it wraps
        with st.expander(f"Unavailable models ({len(unavailable)}) and why"):
            for value, reason in unavailable.items():
                st.markdown(f"- `{value}`: {reason}")
    offline = "demo" in (state["worker_model"], state["grader_model"]) or (
        state["grader_model"] == "rules")
    st.checkbox(
        "Pace the offline demo", key="pace_demo", disabled=not offline,
        help="The offline demo worker and rules grader answer at once; paced, the draft "
        "streams slowly and each verdict takes a second, so every draft, verdict and revision "
        "can be followed. Real models are never slowed.",
    )
    st.number_input(
        "Max iterations", min_value=sup.MIN_ITERATIONS, max_value=sup.MAX_ITERATIONS, step=1,
        key="max_iterations", help="Grader passes allowed before the run stops.",
    )
    if max_iterations_notice:
        st.warning(max_iterations_notice)
    with st.expander("Verdict stability", expanded=state["grader_repeats"] > 1
                     or state["return_best"]):
        st.number_input(
            "Grader repeats", min_value=1, max_value=sup.MAX_GRADER_REPEATS, step=1,
            key="grader_repeats", help="Grade each answer this many times and take the verdict "
            "of the repeats per criterion; criteria the repeats disagree on are marked "
            "unstable. Costs that many grader calls per pass.",
        )
        st.selectbox(
            "Consensus", sup.CONSENSUS_MODES, key="consensus",
            disabled=state["grader_repeats"] < 2,
            help="majority: most repeats decide (a tie fails). unanimous: every repeat must "
            "pass the criterion.",
        )
        st.checkbox(
            "Return the best attempt at the cap", key="return_best",
            help="When the run ends at the iteration cap, end with the answer of the pass that "
            "met the most criteria instead of the last answer.",
        )
    with st.expander("Output limits", expanded=bool(state["worker_max_tokens"]
                                                    or state["grader_max_tokens"])):
        for key, label, default in (
                ("worker_max_tokens", "Worker max tokens", sup.DEFAULT_WORKER_MAX_TOKENS),
                ("grader_max_tokens", "Grader max tokens", sup.DEFAULT_GRADER_MAX_TOKENS)):
            st.number_input(
                label, min_value=0, max_value=sup.MAX_OUTPUT_TOKENS, step=256, key=key,
                help=f"The longest reply, in tokens. 0: {default:,} for a model on a base URL "
                "(a small local model may never stop), the provider's own limit for others. "
                "A reply cut at the limit (finish_reason: length) is marked as cut; the "
                "worker is asked for a shorter answer, the grader for a shorter verdict.",
            )
    # Kept while another page is shown (Streamlit drops an undrawn widget's state); never stored.
    state[sup.PRICES_KEY] = state.get(sup.PRICES_KEY, "")
    session_prices = sup.session_prices(state)
    with st.expander("Cost", expanded=bool(session_prices.problems)):
        for model in dict.fromkeys((state["worker_model"], state["grader_model"])):
            st.caption(sup.price_caption(session_prices.prices, model))
        st.text_area("Your prices", key=sup.PRICES_KEY, help=sup.PRICES_HELP,
                     placeholder="openai-compatible:llama3.1=0.2,0.1,0.6")
        for problem in session_prices.problems:
            st.warning(f"Ignored: {problem}")
    sandbox = sup.sandbox_summary()
    getattr(st, sandbox.level)(sandbox.text)
    st.markdown("### Database")
    st.caption(f"In use: `{shown_location(db_path)}`")  # a URL's password masked
    if store_error:
        st.error(store_error, icon=":material/database:")

pages = [
    st.Page("pages/author.py", title="Author", icon=":material/edit_note:", default=True),
    st.Page("pages/run.py", title="Run", icon=":material/play_circle:"),
    st.Page("pages/review.py", title="Review", icon=":material/compare_arrows:"),
    st.Page("pages/experiments.py", title="Experiments", icon=":material/table_chart:"),
    st.Page("pages/lab.py", title="Rubric lab", icon=":material/science:"),
]
page = st.navigation(pages)
if draft_notice:
    st.toast(draft_notice, icon=":material/restore:")
if (wanted := state.pop("_wanted_page", None)) and not wanted.endswith(f"/{page.url_path}.py"):
    # A page that was opened before the router ran (see pages/), or a link's; the URL's link
    # stays in the address bar (a switch would clear it).
    st.switch_page(wanted, query_params=st.query_params.to_dict())
for param, linked_page in sup.LINK_PAGES.items():
    # The address bar links to what is on screen: another page's link goes.
    if param in st.query_params and not linked_page.endswith(f"/{page.url_path}.py"):
        del st.query_params[param]
try:
    page.run()
except StoreError as exc:  # the database went away while the page read it (a server restart)
    st.error(sup.store_error_message(str(exc)), icon=":material/database:")
