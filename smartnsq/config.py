"""Configuration value objects: immutable, validated when built, documented field by field.

Every field carries :func:`doc` metadata (a one-line description, a unit, the accepted range)
next to its default; :func:`describe` returns those records, so the configuration reference in
``docs/`` is generated from the code rather than kept by hand. A field's range can be a
:class:`Rule` (``doc(..., check=seconds(low=0))``): the rule both checks the value
(:func:`check_fields`, from ``__post_init__``) and writes the range text of the reference, so
the documentation and the check are one description and cannot disagree. Other config classes
use the same helpers.
Durations are seconds (``float``) throughout; they are converted to the server's
milliseconds only on the wire. Build a variant with ``dataclasses.replace(config, ...)``,
which validates again.

A bad value raises :class:`~smartnsq.errors.InvalidArgument` at construction, so a
misconfiguration is reported where it is written, not at the first connection.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import socket
import ssl
import textwrap
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypedDict, TypeVar

from .errors import InvalidArgument
from .protocol.compression import COMPRESSIONS, Compression
from .protocol.frames import DEFAULT_MAX_FRAME_SIZE
from .protocol.identify import USER_AGENT, IdentifyOptions
from .protocol.numbers import check_int, check_number, range_text

__all__ = [
    "RETRY_CONCEPTS",
    "ConnectionConfig",
    "ConnectionOptions",
    "Rule",
    "SettingDoc",
    "check_fields",
    "choice",
    "close_timeout",
    "describe",
    "doc",
    "duck",
    "flag",
    "instance",
    "integer",
    "keyword_options",
    "number",
    "one_source",
    "option_default_text",
    "refuse_unknown",
    "seconds",
    "text",
]

C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class Rule:
    """What a field accepts: ``text`` for the reference, ``check(name, value, obj)`` raising
    :class:`InvalidArgument` naming the field (``obj`` is the whole config, for bounds that
    are other fields)."""

    text: str
    check: Callable[[str, Any, Any], None]


def doc(text: str, *, unit: str = "", range: str = "",
        check: Rule | None = None, concept: str = "") -> dict[str, Any]:
    """Field metadata for the generated reference: one line of text, a unit, the range (the
    rule's text when a rule is given), the rule itself, and the retry ``concept`` (a key of
    :data:`RETRY_CONCEPTS`) the field sets, if any."""
    if concept and concept not in RETRY_CONCEPTS:
        raise KeyError(f"unknown retry concept {concept!r}")
    return {"doc": text, "unit": unit, "range": range or (check.text if check else ""),
            "check": check, "concept": concept}


RETRY_CONCEPTS: dict[str, tuple[str, str]] = {
    "attempt": (
        "Back-off between the attempts of one call",
        "Named retry_delay / retry_delay_max wherever a call is tried again. The Producer's "
        "is short (0.05 s to 1 s) because a publish retries inside its caller's deadline "
        "(timeout, 10 s) and the usual cause, a leader move, is resolved by the next lookup; "
        "the lookup's rounds back off from 0.1 s to 2 s because they are retried only when no "
        "lookupd answered at all, and asking an unreachable lookupd tier faster helps nobody."),
    "redial": (
        "Wait before dialling a failed nsqd again",
        "Named reconnect_delay / reconnect_delay_max on both clients. The Producer's tops out "
        "at 2 s because a publish waits on that dial within its deadline (a route change ends "
        "the wait early); the Consumer's grows to 60 s because nobody waits on a resubscribe, "
        "and a down nsqd is spared a reconnect storm from every consumer of it."),
    "skip": (
        "How long a failing lookupd is left out",
        "Named backoff / backoff_max (LookupConfig): not a wait before trying the same call "
        "again but how long one lookupd of several is left out of the rounds while the others "
        "are asked; it doubles per consecutive failure, as the other two do."),
    "refresh": (
        "Gap between on-demand lookups of one topic",
        "refresh_min_interval / refresh_max_interval (LookupConfig): short (0.1 s) because a "
        "publish or a consumer waiting for a new leader is waiting on the answer."),
}
"""The retry and back-off settings by concept: a title and why the names and defaults are
what they are. Every field that sets one says so (``doc(..., concept=...)``) and the
configuration reference lists them side by side (``docs_reference.retries_table``)."""


def check_fields(obj: Any) -> None:
    """Run every field's rule on a config instance (call it from ``__post_init__``)."""
    for f in dataclasses.fields(obj):
        rule = f.metadata.get("check")
        if rule is not None:
            rule.check(f.name, getattr(obj, f.name), obj)


def number(low: float | str = 0, *, low_open: bool = False, high: float | None = None,
           optional: bool = False, what: str = "number", finite: bool = True) -> Rule:
    """A finite number (``what`` names it in errors) from ``low`` (``low_open``: above it) to
    ``high``; ``low`` may name another field (``">= initial"``); ``optional`` allows None;
    ``finite=False`` allows infinity ("wait for ever"). The check and its error text are
    :func:`smartnsq.protocol.numbers.check_number`'s, as for every number argument."""
    text = range_text(low, high, low_open=low_open) + (" or None" if optional else "")

    def check(name: str, value: Any, obj: Any) -> None:
        if value is None and optional:
            return
        floor = float(getattr(obj, low)) if isinstance(low, str) else None
        check_number(name, value, low, low_open=low_open, high=high, finite=finite,
                     what=what, floor=floor)

    return Rule(text, check)


def seconds(low: float | str = 0, *, low_open: bool = True, high: float | None = None,
            optional: bool = False, finite: bool = True) -> Rule:
    """A finite number of seconds above ``low`` (``low_open=False``: at least ``low``), at
    most ``high``; ``low`` may name another field; ``optional`` allows None; ``finite=False``
    allows infinity."""
    return number(low, low_open=low_open, high=high, optional=optional,
                  what="number of seconds", finite=finite)


def integer(low: int, high: int | None = None, *, optional: bool = False) -> Rule:
    """An int in ``low..high`` (no upper bound when ``high`` is None); ``optional``: or None.
    The check and its error text are :func:`smartnsq.protocol.numbers.check_int`'s."""
    text = range_text(low, high) + (" or None" if optional else "")

    def check(name: str, value: Any, obj: Any) -> None:
        if value is None and optional:
            return
        check_int(name, value, low, high)

    return Rule(text, check)


def flag(*, optional: bool = False) -> Rule:
    """True or False (or None when ``optional``)."""
    allowed: tuple[Any, ...] = (True, False, None) if optional else (True, False)
    text = "True, False or None" if optional else "True or False"

    def check(name: str, value: Any, obj: Any) -> None:
        if not any(value is a for a in allowed):
            raise InvalidArgument(name, f"must be {text}", value)

    return Rule(text, check)


def choice(*values: str) -> Rule:
    """One of a few strings."""
    text = ", ".join(repr(v) for v in values)

    def check(name: str, value: Any, obj: Any) -> None:
        if value not in values:
            raise InvalidArgument(name, f"must be one of {text}", value)

    return Rule(text, check)


def instance(kind: type | tuple[type, ...], text: str, *, optional: bool = True) -> Rule:
    """An instance of ``kind`` (or None when ``optional``); ``text`` names it in the docs."""

    def check(name: str, value: Any, obj: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, kind):
            raise InvalidArgument(name, f"must be {text}", value)

    return Rule(text, check)


def text(*, optional: bool = False, empty: bool = True) -> Rule:
    """A str (non-empty unless ``empty``), or None when ``optional``."""
    what = "str" if empty else "non-empty str"
    label = what + (" or None" if optional else "")

    def check(name: str, value: Any, obj: Any) -> None:
        if value is None and optional:
            return
        if not isinstance(value, str) or (not empty and not value):
            raise InvalidArgument(name, f"must be a {label}", value)

    return Rule(label, check)


def duck(text: str) -> Rule:
    """Any object: hooks (the dialect's Protocols) are duck-typed, so nothing is checked
    until they are called; ``text`` names what is expected in the reference."""

    def check(name: str, value: Any, obj: Any) -> None:
        """Duck-typed: accepted as given."""

    return Rule(text, check)


def one_source(who: str, **given: Any) -> str:
    """The name of the one route source given to ``who`` (``lookupd=``, ``nsqd=``,
    ``lookup=``...): a client reads its routes from exactly one, so none or two are refused
    here, with one wording for every client. None or an empty list is "not given"."""
    named = [name for name, value in given.items() if value is not None and value != []
             and value != ()]
    if len(named) != 1:
        names = [f"{name}=" for name in given]
        listed = ", ".join(names[:-1]) + f" or {names[-1]}"
        raise InvalidArgument(who, f"give exactly one of {listed}")
    return named[0]


@dataclass(frozen=True)
class SettingDoc:
    """One row of a generated configuration reference."""

    name: str
    type: str
    default: Any
    doc: str
    unit: str
    range: str


def describe(cls: type) -> list[SettingDoc]:
    """The documentation rows of a config class, in declaration order."""
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        rows.append(SettingDoc(f.name, str(f.type), f.default, meta.get("doc", ""),
                               meta.get("unit", ""), meta.get("range", "")))
    return rows


def _option_fields(*configs: type, skip: Collection[str] = ()) -> list[dataclasses.Field[Any]]:
    """The keyword options of a client whose keywords fill ``configs`` (its own config first,
    then the ConnectionConfig whose fields go to ``connection``): every field once, the first
    config's where two declare a name, none named in ``skip``."""
    seen = set(skip)
    found = []
    for config in configs:
        for f in dataclasses.fields(config):
            if f.name not in seen:
                seen.add(f.name)
                found.append(f)
    return found


class _Shown:
    """A default as help() shows it: the factory's call, not its value's (long) repr."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def option_default_text(f: dataclasses.Field[Any]) -> str:
    """How help() shows a field's default: its repr, or the call of its factory."""
    if f.default_factory is not dataclasses.MISSING:
        factory = f.default_factory
        return "{}" if factory is dict else f"{getattr(factory, '__name__', factory)}()"
    return repr(f.default)


def _shown_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return _Shown(option_default_text(f))
    return f.default


def keyword_options(*configs: type, skip: Collection[str] = ()) -> Callable[[C], C]:
    """Class decorator for a client whose ``**options`` are the fields of ``configs``: its
    signature (``inspect.signature``, ``help()``) and docstring list every option by name,
    type and default, made from the fields, so the declaration stays the one place an option
    is written (type checkers read the names from the client's TypedDict)."""

    def apply(cls: C) -> C:
        init = cls.__init__  # type: ignore[misc]
        signature = inspect.signature(init)
        named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        fields = _option_fields(*configs, skip={*skip, *(p.name for p in named)})
        options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                     default=_shown_default(f), annotation=f.type)
                   for f in fields]
        full = signature.replace(parameters=[*named, *options])
        init.__signature__ = full
        setattr(cls, "__signature__", full.replace(parameters=[*named[1:], *options]))  # noqa: B010
        lines = ["", "", *textwrap.wrap(f"Options (keywords, the defaults of "
                                        f"{' and '.join(c.__name__ for c in configs)}; one "
                                        "given overrides that field of config=):", 88), ""]
        for f in fields:
            unit, check = f.metadata.get("unit"), f.metadata.get("range")
            text = " ".join(filter(None, [f.metadata.get("doc"), unit and f"Unit: {unit}.",
                                          check and f"Range: {check}."]))
            lines.append(f"    {f.name}: {f.type} = {option_default_text(f)}")
            lines.extend(textwrap.wrap(text, 88, initial_indent=" " * 8,
                                       subsequent_indent=" " * 8))
        cls.__doc__ = inspect.cleandoc(cls.__doc__ or "") + "\n".join(lines)
        return cls

    return apply


def refuse_unknown(who: str, given: Iterable[str], accepted: Collection[str],
                   constructor: Callable[..., Any] | None = None) -> None:
    """Raise :class:`InvalidArgument` naming the options of ``given`` not in ``accepted``,
    each with the nearest name (an option or a parameter ``constructor`` names) when one is
    close: a misspelt keyword is told what was meant, not only that it is unknown."""
    unknown = sorted(set(given) - set(accepted))
    if not unknown:
        return
    names = sorted({*accepted, *_named_parameters(constructor)})
    parts = []
    for name in unknown:
        near = difflib.get_close_matches(name, names, n=1)
        parts.append(f"{name!r} (did you mean {near[0]!r}?)" if near else repr(name))
    plural = "s" if len(unknown) > 1 else ""
    raise InvalidArgument(f"{who} option", f"unknown option{plural} {', '.join(parts)}",
                          unknown)


def _named_parameters(function: Callable[..., Any] | None) -> tuple[str, ...]:
    """The parameters a constructor names (not ``self`` nor its ``**options``), read from its
    code, which a signature set by :func:`keyword_options` does not hide."""
    code = getattr(function, "__code__", None)
    return () if code is None else code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]


@lru_cache(maxsize=1)
def _host_name() -> str:
    """The machine's host name for IDENTIFY (asked once: an OS call per connection is waste)."""
    return socket.gethostname()


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _output_buffer(name: str, value: Any, obj: Any) -> None:
    if value is not None and value != -1:
        check_int(name, value, 64, 64 * 1024)


def _key_file(name: str, value: Any, obj: Any) -> None:
    _PATH.check(name, value, obj)
    if value is not None and obj.tls_cert_file is None:
        raise InvalidArgument(name, "needs tls_cert_file", value)


def _secret(name: str, value: Any, obj: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidArgument(name, "must be a non-empty str")  # the value is never shown


def _tls_min_version(name: str, value: Any, obj: Any) -> None:
    if value is None:
        return
    if value not in _TLS_VERSIONS:
        raise InvalidArgument(name, f"must be None or one of {', '.join(map(repr, _TLS_VERSIONS))}",
                              value)
    if isinstance(obj.tls, ssl.SSLContext):
        # a context given is used as is: its floor is the caller's to set (minimum_version),
        # not changed behind their back on an object they may share
        raise InvalidArgument(name, "applies to tls=True; set minimum_version on the "
                              "SSLContext given as tls", value)


# nsqd's own names (--tls-min-version): older versions are not offered, Python's default
# context already refuses them
_TLS_VERSIONS = {"tls1.2": ssl.TLSVersion.TLSv1_2, "tls1.3": ssl.TLSVersion.TLSv1_3}
_PATH = Rule("path or None", text(optional=True).check)
_TEXT = text(optional=True)
_OUTPUT_BUFFER = Rule("-1, 64..65536 or None", _output_buffer)
_KEY_FILE = Rule("path or None (with tls_cert_file)", _key_file)
_SECRET = Rule("non-empty str or None", _secret)
_TLS_MIN = Rule("None, 'tls1.2' or 'tls1.3'", _tls_min_version)


@dataclass(frozen=True)
class ConnectionConfig:
    """How one connection to an nsqd is opened and run (timeouts, features, TLS, auth)."""

    connect_timeout: float = field(default=5.0, metadata=doc(
        "Deadline for the TCP connect plus the whole handshake (IDENTIFY, TLS, AUTH).",
        unit="s", check=seconds()))
    request_timeout: float | None = field(default=10.0, metadata=doc(
        "Default deadline of a request that gets an answer (PUB, SUB, ...); a request past "
        "it fails with Timeout and its late answer is discarded (the connection stays "
        "open); None waits for ever.", unit="s", check=seconds(optional=True)))
    max_timed_out: int = field(default=256, metadata=doc(
        "Timed-out requests still unanswered after which the connection is deemed dead and "
        "closed (so is one whose oldest such request stays unanswered for twice its "
        "timeout).", check=integer(1, 65536)))
    close_timeout: float = field(default=5.0, metadata=doc(
        "How long close() waits for the socket to shut down before aborting it.",
        unit="s", check=seconds()))
    heartbeat_interval: float | None = field(default=30.0, metadata=doc(
        "Heartbeat interval asked of the server; silence for twice this closes the connection "
        "as stalled; None disables heartbeats (the server then refuses SUB).",
        unit="s", check=seconds(1, low_open=False, high=60, optional=True)))
    msg_timeout: float | None = field(default=None, metadata=doc(
        "How long the server waits for FIN before redelivering; None keeps the server's "
        "default (60 s).", unit="s", check=seconds(1, low_open=False, high=900, optional=True)))
    output_buffer_size: int | None = field(default=None, metadata=doc(
        "Server-side output buffer for this client; None keeps the server default, -1 "
        "disables buffering.", unit="bytes", check=_OUTPUT_BUFFER))
    output_buffer_timeout: float | None = field(default=None, metadata=doc(
        "Longest time the server holds buffered output; None keeps the server default.",
        unit="s", check=seconds(0.01, low_open=False, high=1, optional=True)))
    sample_rate: int = field(default=0, metadata=doc(
        "Percentage of messages the server delivers (0 = all); must be 0 for ordered "
        "subscriptions.", unit="%", check=integer(0, 99)))
    compression: Compression = field(default="none", metadata=doc(
        "Stream compression to negotiate; the server may decline it.",
        check=choice(*COMPRESSIONS)))
    deflate_level: int = field(default=6, metadata=doc(
        "Deflate level asked of the server (it caps it at its max_deflate_level).",
        check=integer(1, 9)))
    tls: bool | ssl.SSLContext = field(default=False, metadata=doc(
        "Negotiate TLS (tls_v1): an ssl.SSLContext is used as is; True builds a verifying "
        "context from the tls_* options.",
        check=instance((bool, ssl.SSLContext), "bool or SSLContext", optional=False)))
    tls_verify: bool = field(default=True, metadata=doc(
        "Verify the server's certificate and host name (when tls is True).", check=flag()))
    tls_ca_file: str | None = field(default=None, metadata=doc(
        "CA bundle (PEM) to verify the server with; None uses the system store.",
        check=_PATH))
    tls_cert_file: str | None = field(default=None, metadata=doc(
        "Client certificate (PEM) for servers that ask for one.", check=_PATH))
    tls_key_file: str | None = field(default=None, metadata=doc(
        "Private key of tls_cert_file when it is a separate file.", check=_KEY_FILE))
    tls_server_hostname: str | None = field(default=None, metadata=doc(
        "Name the certificate must match; None uses the host connected to (a unix socket "
        "has none: verifying its nsqd's certificate needs this name).", check=_TEXT))
    tls_min_version: str | None = field(default=None, metadata=doc(
        "Oldest TLS version accepted (nsqd's --tls-min-version names; when tls is True); "
        "None keeps Python's floor (TLS 1.2). TLS 1.3 is used whenever the server offers "
        "it: no maximum is set.", check=_TLS_MIN))
    tls_required: bool = field(default=True, metadata=doc(
        "With tls on, refuse a server that answers tls_v1:false rather than go on in "
        "plaintext.", check=flag()))
    auth_secret: str | None = field(default=None, repr=False, metadata=doc(
        "Secret sent with AUTH when the server answers auth_required; never logged.",
        check=_SECRET))
    allow_plaintext_auth: bool = field(default=False, metadata=doc(
        "Send auth_secret over a connection without TLS; by default such a server is "
        "refused (PlaintextAuthRefused) rather than given the secret in the clear.",
        check=flag()))
    max_frame_size: int = field(default=DEFAULT_MAX_FRAME_SIZE, metadata=doc(
        "Largest frame accepted from the server; a larger size prefix means a corrupt "
        "stream.", unit="bytes", check=integer(1024, 2**31 - 1)))
    flush_threshold: int = field(default=64 * 1024, metadata=doc(
        "Queued command bytes that trigger a write before the end of the event-loop "
        "iteration.", unit="bytes", check=integer(1, 2**31 - 1)))
    client_id: str | None = field(default=None, metadata=doc(
        "client_id sent in IDENTIFY; None uses the short host name.", check=_TEXT))
    hostname: str | None = field(default=None, metadata=doc(
        "hostname sent in IDENTIFY; None uses the machine's host name.", check=_TEXT))
    user_agent: str = field(default=USER_AGENT, metadata=doc(
        "user_agent sent in IDENTIFY.", check=text()))

    def __post_init__(self) -> None:
        check_fields(self)

    # -- derived values ---------------------------------------------------------------------

    @property
    def tls_enabled(self) -> bool:
        return self.tls is not False

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client-side context to upgrade with (``None`` when TLS is off).

        Built fresh on each call from the ``tls_*`` options: verifying by default, because a
        message bus carries credentials and business data.
        """
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        if not self.tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.tls_cert_file is not None:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_min_version is not None:
            context.minimum_version = _TLS_VERSIONS[self.tls_min_version]
        return context

    def tls_server_name(self, host: str | None) -> str | None:
        """The name the server's certificate is verified against: ``tls_server_hostname``,
        else ``host`` (``None`` for a unix socket, which has no host name).

        Raises :class:`InvalidArgument` when the certificate's name would be checked and
        there is none, so that the mistake is reported before connecting rather than as a
        handshake failure; without a name check (``tls_verify=False``, a context with
        ``check_hostname`` off) ``None`` is fine.
        """
        name = self.tls_server_hostname or host
        checks = (self.tls.check_hostname if isinstance(self.tls, ssl.SSLContext)
                  else self.tls_verify)
        if name is None and checks:
            raise InvalidArgument("tls_server_hostname", "must name the certificate of an "
                                  "nsqd reached over a unix socket (it has no host name to "
                                  "verify against)")
        return name

    def identify_options(self, *, extend_support: bool = False, desired_tag: str = "",
                         ext_filter: dict[str, Any] | None = None) -> IdentifyOptions:
        """The IDENTIFY body for this configuration plus the per-subscription extras."""
        host = _host_name() if self.client_id is None or self.hostname is None else ""
        return IdentifyOptions(
            client_id=host.split(".")[0] if self.client_id is None else self.client_id,
            hostname=host if self.hostname is None else self.hostname,
            user_agent=self.user_agent,
            heartbeat_interval=(-1 if self.heartbeat_interval is None
                                else _ms(self.heartbeat_interval)),
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=(None if self.output_buffer_timeout is None
                                   else _ms(self.output_buffer_timeout)),
            msg_timeout=0 if self.msg_timeout is None else _ms(self.msg_timeout),
            sample_rate=self.sample_rate,
            tls_v1=self.tls_enabled,
            snappy=self.compression == "snappy",
            deflate=self.compression == "deflate",
            deflate_level=self.deflate_level,
            extend_support=extend_support,
            desired_tag=desired_tag,
            ext_filter=ext_filter,
        )


class ConnectionOptions(TypedDict, total=False):
    """ConnectionConfig's fields as keywords of a client (``Producer(..., tls=True)``): what
    type checkers and editors read, kept equal to the fields by a test."""

    connect_timeout: float
    request_timeout: float | None
    max_timed_out: int
    close_timeout: float
    heartbeat_interval: float | None
    msg_timeout: float | None
    output_buffer_size: int | None
    output_buffer_timeout: float | None
    sample_rate: int
    compression: Compression
    deflate_level: int
    tls: bool | ssl.SSLContext
    tls_verify: bool
    tls_ca_file: str | None
    tls_cert_file: str | None
    tls_key_file: str | None
    tls_server_hostname: str | None
    tls_min_version: str | None
    tls_required: bool
    auth_secret: str | None
    allow_plaintext_auth: bool
    max_frame_size: int
    flush_threshold: int
    client_id: str | None
    hostname: str | None
    user_agent: str


_CLOSE_TIMEOUT = seconds(low_open=False)


def close_timeout(timeout: float | None, default: float) -> float:
    """A client's ``close(timeout)`` deadline in seconds: ``None`` is ``default`` (its
    ``drain_timeout``); 0 closes at once (no drain); never unbounded; anything else is an
    ``InvalidArgument`` naming ``timeout``."""
    if timeout is None:
        return float(default)
    _CLOSE_TIMEOUT.check("timeout", timeout, None)
    return float(timeout)
