"""Fixtures shared by the test files that use them (``pytest.mark.usefixtures``)."""

import pytest


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A fresh working directory and trial store (its URL, in CUBIC_STORE), no pending file named by
    the environment: a CLI test sees only what it writes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUBIC_PENDING", raising=False)
    url = f"sqlite:///{tmp_path}/trials.db"
    monkeypatch.setenv("CUBIC_STORE", url)
    return url
