"""Fixtures for the marin tests: headless Chromium for the browser tests (see browser.py)."""

from tests.marin.browser import browser, chromium_path, page, web_server, web_tree  # noqa: F401 (pytest finds fixtures by name)
