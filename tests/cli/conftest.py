"""The CLI tests run the commands in-process; a user's ``SMARTNSQ_LOOKUPD`` must not steer them
(each test names its lookupds, or tests the variable itself with ``monkeypatch.setenv``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_env_lookupd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SMARTNSQ_LOOKUPD", raising=False)
