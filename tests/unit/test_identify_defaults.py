"""The host name IDENTIFY announces comes from the connection layer, not the sans-I/O codec."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import smartnsq.protocol
from smartnsq.config import ConnectionConfig
from smartnsq.protocol.identify import IdentifyOptions


def test_the_codec_makes_no_os_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> str:
        raise AssertionError("socket.gethostname() called from the sans-I/O package")

    monkeypatch.setattr(socket, "gethostname", refuse)
    data = IdentifyOptions().to_json()
    assert "hostname" not in data and "client_id" not in data  # empty: not sent
    for path in Path(smartnsq.protocol.__file__).parent.glob("*.py"):
        assert "import socket" not in path.read_text(), path.name


def test_the_connection_config_passes_the_host_name_in() -> None:
    host = socket.gethostname()
    options = ConnectionConfig().identify_options()
    assert options.hostname == host and options.client_id == host.split(".")[0]
    data = options.to_json()
    assert data["hostname"] == host and data["client_id"] == host.split(".")[0]
    given = ConnectionConfig(client_id="worker-7", hostname="box").identify_options()
    assert (given.client_id, given.hostname) == ("worker-7", "box")
    half = ConnectionConfig(client_id="worker-7").identify_options()
    assert (half.client_id, half.hostname) == ("worker-7", host)
