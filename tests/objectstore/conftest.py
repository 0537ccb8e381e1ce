"""Shared fixtures of the object-store tests (the server itself, ``s3_server``, comes from
:mod:`exactly.testing.pytest_plugin`)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket's name, with the server in the ``AWS_*`` environment (what the commit
    log's and the stages' clients read)."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name
