"""The Streamlit script ``llmslo dashboard`` runs: page config and navigation.

Run by ``streamlit run`` (never imported by the library); the source comes from
``LLMSLO_DASHBOARD_SOURCE`` (see :mod:`dashboards.context`). The Fleet page is the root
URL; ``/fleet`` serves it too (hidden from the menu), because Streamlit serves the default
page only at the root and deep links name every page.
"""

from __future__ import annotations

import streamlit as st

from dashboards.views import PAGES


def _fleet_by_name() -> None:
    PAGES["fleet"][2]()


st.set_page_config(page_title="llmslo", page_icon=":material/monitoring:", layout="wide")
pages = [
    st.Page(
        function,
        title=title,
        icon=icon,
        url_path="overview" if path == "fleet" else path,
        default=path == "fleet",
    )
    for path, (title, icon, function) in PAGES.items()
]
pages.append(st.Page(_fleet_by_name, title="Fleet", url_path="fleet", visibility="hidden"))
navigation = st.navigation(pages)
navigation.run()
