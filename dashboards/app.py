"""The Streamlit script ``llmslo dashboard`` runs: page config and navigation.

Run by ``streamlit run`` (never imported by the library); the source comes from
``LLMSLO_DASHBOARD_SOURCE`` (see :mod:`dashboards.context`).
"""

from __future__ import annotations

import streamlit as st

from dashboards.views import PAGES

st.set_page_config(page_title="llmslo", page_icon=":material/monitoring:", layout="wide")
navigation = st.navigation(
    [
        st.Page(function, title=title, icon=icon, url_path=path, default=path == "fleet")
        for path, (title, icon, function) in PAGES.items()
    ]
)
navigation.run()
