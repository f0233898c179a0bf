"""ConnectionConfig: validation at construction, what it puts in IDENTIFY, TLS contexts, docs.

No server needed; kept beside the connection tests because the config exists for them.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from smartnsq.config import ConnectionConfig, describe
from smartnsq.errors import InvalidArgument
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection


@pytest.mark.parametrize("field,value", [
    ("connect_timeout", 0), ("connect_timeout", -1), ("connect_timeout", float("inf")),
    ("connect_timeout", None), ("request_timeout", 0), ("close_timeout", "5"),
    ("heartbeat_interval", 0.5), ("heartbeat_interval", 61), ("heartbeat_interval", True),
    ("msg_timeout", 0.5), ("msg_timeout", 901), ("output_buffer_size", 63),
    ("output_buffer_size", 65537), ("output_buffer_timeout", 0.001), ("output_buffer_timeout", 2),
    ("sample_rate", 100), ("sample_rate", -1), ("compression", "gzip"), ("compression", None),
    ("deflate_level", 0), ("deflate_level", 10), ("tls", "yes"), ("tls_key_file", "k.pem"),
    ("auth_secret", ""), ("auth_secret", b"bytes"), ("max_frame_size", 10),
    ("flush_threshold", 0),
])
def test_bad_values_are_refused_at_construction(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgument) as caught:
        ConnectionConfig(**{field: value})
    assert caught.value.field == field


def test_replace_validates_again() -> None:
    config = ConnectionConfig()
    with pytest.raises(InvalidArgument):
        dataclasses.replace(config, deflate_level=11)
    assert dataclasses.replace(config, deflate_level=9).deflate_level == 9


def test_identify_options_use_milliseconds_on_the_wire() -> None:
    config = ConnectionConfig(heartbeat_interval=2.5, msg_timeout=90, output_buffer_size=-1,
                              output_buffer_timeout=0.05, compression="deflate",
                              deflate_level=3, tls=True, client_id="c1", hostname="h1",
                              sample_rate=10)
    body = config.identify_options(extend_support=True, desired_tag="tag1").to_json()
    assert body["heartbeat_interval"] == 2500 and body["msg_timeout"] == 90_000
    assert body["output_buffer_size"] == -1 and body["output_buffer_timeout"] == 50
    assert body["deflate"] is True and body["snappy"] is False and body["deflate_level"] == 3
    assert body["tls_v1"] is True and body["feature_negotiation"] is True
    assert (body["client_id"], body["hostname"], body["sample_rate"]) == ("c1", "h1", 10)
    assert body["extend_support"] is True and body["desired_tag"] == "tag1"
    off = ConnectionConfig(heartbeat_interval=None).identify_options().to_json()
    assert off["heartbeat_interval"] == -1 and "msg_timeout" not in off


def test_secret_is_not_in_repr() -> None:
    assert "hunter2" not in repr(ConnectionConfig(auth_secret="hunter2"))


def test_ssl_contexts(tmp_path: Path) -> None:
    assert ConnectionConfig().ssl_context() is None
    verifying = ConnectionConfig(tls=True).ssl_context()
    assert verifying is not None
    assert verifying.verify_mode == ssl.CERT_REQUIRED and verifying.check_hostname
    lax = ConnectionConfig(tls=True, tls_verify=False).ssl_context()
    assert lax is not None and lax.verify_mode == ssl.CERT_NONE and not lax.check_hostname
    given = ssl.create_default_context()
    assert ConnectionConfig(tls=given).ssl_context() is given
    ca = trustme.CA()
    cert = ca.issue_cert("client.test")
    cert_file, ca_file = tmp_path / "client.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    ca.cert_pem.write_to_path(str(ca_file))
    mutual = ConnectionConfig(tls=True, tls_ca_file=str(ca_file),
                              tls_cert_file=str(cert_file)).ssl_context()
    assert mutual is not None and mutual.get_ca_certs()


def test_every_field_is_documented() -> None:
    rows = describe(ConnectionConfig)
    assert [r.name for r in rows] == [f.name for f in dataclasses.fields(ConnectionConfig)]
    for row in rows:
        assert row.doc and "\n" not in row.doc, row.name
        assert row.default is not dataclasses.MISSING, row.name
    assert {r.name: r.unit for r in rows}["connect_timeout"] == "s"


async def test_calls_before_open_are_refused() -> None:
    conn = Connection("127.0.0.1", 4150)
    with pytest.raises(RuntimeError):
        conn.submit(commands.nop(), "NOP")
    with pytest.raises(RuntimeError):
        conn.send(commands.nop())
    assert not conn.is_ready and not conn.is_closed
    await conn.close()
    assert conn.is_closed and conn.closed.result() is None
