"""Fixtures shared by the integration tier."""

from __future__ import annotations

from tests.browser import browser  # noqa: F401  (the headless Chromium fixture of the page tests)
