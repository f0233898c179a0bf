"""nsqd addresses that are unix socket paths, and the TLS options that go with them.

The spellings are nsqd's own (``--tcp-address`` takes ``<addr>:<port>`` or a path) and
go-nsq's (``NewProducer("/tmp/nsqd.sock")``), plus ``unix:PATH`` for a relative path or a
path with a colon in it. A path is checked when it is given, so a name the kernel cannot
take (longer than ``sun_path``) fails at construction, not at the first connect.
"""

from __future__ import annotations

import ssl
import sys

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.errors import InvalidArgument
from smartnsq.model.routes import (
    UNIX_PATH_MAX,
    StaticRouteSource,
    TopicRoutes,
    address_text,
    describe,
    is_unix,
    parse_address,
    sun_path,
)


@pytest.mark.parametrize(("text", "path"), [
    ("/run/nsqd.sock", "/run/nsqd.sock"),
    ("unix:/run/nsqd.sock", "/run/nsqd.sock"),
    ("unix:nsqd.sock", "nsqd.sock"),  # relative: to the working directory, as nsqd takes it
    ("unix:/tmp/odd:name.sock", "/tmp/odd:name.sock"),
    ("/tmp/with:colon:4150", "/tmp/with:colon:4150"),  # a path, not host "/tmp/with:colon"
])
def test_a_socket_path_is_an_address(text: str, path: str) -> None:
    address = parse_address(text, "nsqd")
    assert address == (path, 0)
    assert is_unix(address)
    assert address_text(address) == f"unix:{path}"
    assert parse_address(address_text(address)) == address  # the text form round-trips


@pytest.mark.parametrize("text", ["127.0.0.1:4150", "nsqd.example:4150", "[::1]:4150"])
def test_host_and_port_are_unchanged(text: str) -> None:
    address = parse_address(text)
    assert not is_unix(address)
    assert address[1] == 4150
    assert address_text(address) == f"{address[0]}:4150"


def test_a_split_pair_of_a_path_is_accepted() -> None:
    assert parse_address(("/run/nsqd.sock", 0)) == ("/run/nsqd.sock", 0)


@pytest.mark.parametrize(("text", "words"), [
    ("unix:", "path"),
    ("unix:/run/bad\0.sock", "NUL"),
    ("/" + "x" * UNIX_PATH_MAX, f"{UNIX_PATH_MAX} bytes"),
    ("unix:" + "é" * (UNIX_PATH_MAX // 2 + 1), f"{UNIX_PATH_MAX} bytes"),  # bytes, not chars
    ("host:0", "1..65535"),
    ("nsqd.sock", "host:port"),  # a relative path needs unix:, else it is a typo'd host
])
def test_bad_addresses_are_refused_naming_the_argument(text: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_address(text, "nsqd")
    assert raised.value.field == "nsqd"
    assert words in str(raised.value)


def test_the_longest_path_the_kernel_takes_is_accepted() -> None:
    path = "/" + "x" * (UNIX_PATH_MAX - 1)
    assert parse_address(path) == (path, 0)
    assert (103 if sys.platform == "darwin" or "bsd" in sys.platform else 107) == UNIX_PATH_MAX


async def test_a_static_source_takes_paths_beside_hosts() -> None:
    source = StaticRouteSource(["/run/a.sock", "unix:/run/a.sock", "127.0.0.1:4150"])
    routes = await source.routes("t")
    assert routes.nodes == (("/run/a.sock", 0), ("127.0.0.1", 4150))


def test_a_too_long_path_fails_where_the_nsqd_list_is_given() -> None:
    with pytest.raises(InvalidArgument, match="nsqd"):
        StaticRouteSource(["/" + "x" * 200])


def test_describe_names_the_path() -> None:
    routes = TopicRoutes("t", nodes=(("/run/nsqd.sock", 0), ("127.0.0.1", 4150)))
    assert describe(routes) == "nodes unix:/run/nsqd.sock, 127.0.0.1:4150"


# -- TLS options ----------------------------------------------------------------------------


def test_the_default_context_does_not_cap_the_version() -> None:
    context = ConnectionConfig(tls=True).ssl_context()
    assert context is not None
    assert context.maximum_version in (ssl.TLSVersion.MAXIMUM_SUPPORTED, ssl.TLSVersion.TLSv1_3)
    assert context.minimum_version <= ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize(("name", "version"), [("tls1.2", ssl.TLSVersion.TLSv1_2),
                                               ("tls1.3", ssl.TLSVersion.TLSv1_3)])
def test_tls_min_version_sets_the_floor(name: str, version: ssl.TLSVersion) -> None:
    context = ConnectionConfig(tls=True, tls_min_version=name).ssl_context()
    assert context is not None
    assert context.minimum_version == version
    assert context.maximum_version in (ssl.TLSVersion.MAXIMUM_SUPPORTED, ssl.TLSVersion.TLSv1_3)


@pytest.mark.parametrize("bad", ["tls1.0", "TLSv1.3", "1.3", 3])
def test_tls_min_version_takes_nsqds_names_only(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="tls_min_version"):
        ConnectionConfig(tls=True, tls_min_version=bad)  # type: ignore[arg-type]


def test_tls_min_version_is_not_applied_to_a_given_context() -> None:
    # a context given as is stays the caller's: its floor is set on it, not behind its back
    with pytest.raises(InvalidArgument, match="tls_min_version"):
        ConnectionConfig(tls=ssl.create_default_context(), tls_min_version="tls1.3")


def test_a_socket_has_no_host_name_to_verify() -> None:
    verifying = ConnectionConfig(tls=True)
    with pytest.raises(InvalidArgument, match="tls_server_hostname"):
        verifying.tls_server_name(None)
    assert verifying.tls_server_name("10.0.0.1") == "10.0.0.1"
    named = ConnectionConfig(tls=True, tls_server_hostname="nsqd.internal")
    assert named.tls_server_name(None) == "nsqd.internal"
    assert ConnectionConfig(tls=True, tls_verify=False).tls_server_name(None) is None
    loose = ssl.create_default_context()
    loose.check_hostname = False
    assert ConnectionConfig(tls=loose).tls_server_name(None) is None
    with pytest.raises(InvalidArgument, match="tls_server_hostname"):
        ConnectionConfig(tls=ssl.create_default_context()).tls_server_name(None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets: Linux")
@pytest.mark.parametrize("text", ["@nsqd", "unix:@nsqd"])
def test_an_abstract_name_as_go_spells_it(text: str) -> None:
    address = parse_address(text)
    assert address == ("@nsqd", 0) and address_text(address) == "unix:@nsqd"
    assert sun_path(address) == "\0nsqd"  # what the kernel is given
    assert sun_path(("/run/nsqd.sock", 0)) == "/run/nsqd.sock"
