"""The clients' keyword options are declared once (the config dataclasses): the TypedDicts that
type them, the constructors' signatures and docstrings, and the error for a misspelt name all
come from that one declaration, so none can drift from it."""

from __future__ import annotations

import dataclasses
import inspect
import pydoc
import re
from typing import Any, ForwardRef

import pytest

import smartnsq
from smartnsq import sync
from smartnsq.config import ConnectionConfig, ConnectionOptions, option_default_text
from smartnsq.consumer.config import ConsumerConfig
from smartnsq.consumer.options import WIDER, ConsumerOptions
from smartnsq.discovery.lookup import LookupManager
from smartnsq.errors import InvalidArgument
from smartnsq.producer.config import ProducerConfig
from smartnsq.producer.options import ProducerOptions

NSQD = ["127.0.0.1:4150"]


def _declared(*configs: type) -> dict[str, dataclasses.Field[Any]]:
    """The options a client takes: its config's fields, then ConnectionConfig's not named
    already (those go to ``connection``)."""
    fields: dict[str, dataclasses.Field[Any]] = {}
    for config in configs:
        for f in dataclasses.fields(config):
            fields.setdefault(f.name, f)
    return fields


def _annotation(value: object) -> str:
    return value.__forward_arg__ if isinstance(value, ForwardRef) else str(value)


@pytest.mark.parametrize(("options", "configs"), [
    (ConnectionOptions, (ConnectionConfig,)),
    (ConsumerOptions, (ConsumerConfig, ConnectionConfig)),
    (ProducerOptions, (ProducerConfig, ConnectionConfig)),
], ids=["connection", "consumer", "producer"])
def test_each_typed_dict_matches_the_declaration(options: Any, configs: tuple[type, ...]) -> None:
    declared = _declared(*configs)
    annotations = {name: _annotation(a) for name, a in options.__annotations__.items()}
    assert set(annotations) == set(declared), (
        f"missing {sorted(set(declared) - set(annotations))}, "
        f"extra {sorted(set(annotations) - set(declared))}")
    wider = WIDER if options is ConsumerOptions else {}
    for name, f in declared.items():
        assert annotations[name] == wider.get(name, str(f.type)), name
    assert not options.__required_keys__  # every option may be left out


CLIENTS = [(smartnsq.Consumer, (ConsumerConfig, ConnectionConfig)),
           (smartnsq.Producer, (ProducerConfig, ConnectionConfig)),
           (sync.Consumer, (ConsumerConfig, ConnectionConfig)),
           (sync.Producer, (ProducerConfig, ConnectionConfig))]
IDS = ["Consumer", "Producer", "sync.Consumer", "sync.Producer"]


@pytest.mark.parametrize(("client", "configs"), CLIENTS, ids=IDS)
def test_help_lists_every_option_with_its_type_and_default(client: type,
                                                           configs: tuple[type, ...]) -> None:
    text = pydoc.render_doc(client, renderer=pydoc.plaintext)
    for name, f in _declared(*configs).items():
        if client is sync.Consumer and name == "concurrency":
            continue  # its concurrency is threads=
        default = re.escape(option_default_text(f))
        pattern = rf"\b{name}: '?{re.escape(str(f.type))}'? = {default}"
        assert re.search(pattern, text), f"{client.__qualname__}: {name} = {default}"


@pytest.mark.parametrize(("client", "configs"), CLIENTS, ids=IDS)
def test_the_signature_takes_every_option_by_keyword(client: type,
                                                     configs: tuple[type, ...]) -> None:
    parameters = inspect.signature(client).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    for name, f in _declared(*configs).items():
        if client is sync.Consumer and name == "concurrency":
            assert name not in parameters
            continue
        parameter = parameters[name]
        assert parameter.kind is parameter.KEYWORD_ONLY, name
        assert parameter.annotation == str(f.type), name
        assert repr(parameter.default) == option_default_text(f), name
    assert "self" not in parameters
    assert "self" in inspect.signature(client.__init__).parameters


def _consumer(**options: Any) -> object:
    return smartnsq.Consumer("t", "c", nsqd=NSQD, **options)


def _producer(**options: Any) -> object:
    return smartnsq.Producer(nsqd=NSQD, **options)


def _sync_consumer(**options: Any) -> object:
    return sync.Consumer("t", "c", nsqd=NSQD, **options)


def _sync_producer(**options: Any) -> object:
    return sync.Producer(nsqd=NSQD, **options)


def _lookup(**options: Any) -> object:
    return LookupManager(["127.0.0.1:4161"], **options)


@pytest.mark.parametrize(("make", "who", "typo", "meant"), [
    (_consumer, "Consumer", "max_inflight", "max_in_flight"),
    (_consumer, "Consumer", "msg_timout", "msg_timeout"),  # a connection option
    (_consumer, "Consumer", "lookupds", "lookupd"),  # a named parameter
    (_producer, "Producer", "timout", "timeout"),
    (_producer, "Producer", "tls_verfy", "tls_verify"),
    (_sync_consumer, "Consumer", "max_inflight", "max_in_flight"),
    (_sync_consumer, "Consumer", "thread", "threads"),
    (_sync_producer, "Producer", "linger_ms", "linger"),
    (_lookup, "LookupManager", "poll_intervall", "poll_interval"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_an_unknown_option_suggests_the_name_meant(make: Any, who: str, typo: str,
                                                   meant: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        make(**{typo: 1})
    assert info.value.field == f"{who} option"
    assert f"unknown option {typo!r} (did you mean {meant!r}?)" in str(info.value)


def test_a_name_like_none_is_refused_without_a_guess() -> None:
    with pytest.raises(InvalidArgument) as info:
        _consumer(zzzz=1, max_inflight=2)
    text = str(info.value)
    assert "unknown options 'max_inflight' (did you mean 'max_in_flight'?), 'zzzz'" in text
    assert info.value.value == ["max_inflight", "zzzz"]
