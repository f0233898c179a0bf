"""Every exception smartnsq raises, and what each server error code means.

Hierarchy (every class is importable from here, and from here only)::

    NSQError
    ├── InvalidArgument (also ValueError)    bad input caught before any byte is sent
    ├── ProtocolError                         bytes that do not follow the wire protocol
    │   └── HttpError                         an HTTP answer this client cannot read
    │       ├── NotHttp                       not HTTP at all (``found`` says what it was)
    │       └── AnswerTooLarge                a body over the bound
    ├── ConnectionFailed                      the socket failed or closed under a call
    │   ├── ConnectionClosed                  closed while calls were pending
    │   ├── ClientClosed (also RuntimeError)  a call on a blocking facade after close()
    │   ├── ProducerClosed                    a publish attempt after close() began
    │   ├── NodeBackoff                       an nsqd whose connect failed, not redialled yet
    │   └── HttpConnectError, HttpTLSError, HttpClosed   an HTTP peer unreachable or gone
    ├── Timeout (also TimeoutError)           a call ran past its deadline
    │   ├── LoopTimeout                       a blocking wait on the loop thread ran out
    │   └── HttpTimeout                       no whole HTTP answer in time
    │       └── HttpConnectTimeout            no HTTP connection in time
    ├── SecurityError                         a safety rule refused to go on (never retried)
    │   ├── TLSVerificationFailed             the server's certificate was refused
    │   ├── ClientCertificateRefused          the server refused ours (TLS alert)
    │   ├── TLSVersionRefused                 no TLS version both ends accept
    │   ├── TLSNotOffered (also ConnectionFailed)  TLS required, the server offers none
    │   └── PlaintextAuthRefused              AUTH would send the secret unencrypted
    ├── LookupFailed                          no lookupd could answer
    │   ├── LookupTimeout (also a Timeout)    no answer within the caller's deadline
    │   ├── LookupdError                      one lookupd answered with an error
    │   │   └── LookupdRequestFailed          one request to it came to nothing usable
    │   └── TopicNotFound                     lookupd says the topic does not exist
    │       └── TopicNotWritable              it exists, but no partition takes writes yet
    ├── NoLeader                              a partition has no leader in lookup now
    │   └── NotWritable                       its leader is up but takes no writes
    ├── AlreadyResponded (also RuntimeError)  a second FIN/REQ/TOUCH of one message
    │   └── AlreadyRespondedAssertion (also AssertionError)  the same, in the pynsq layer
    ├── AdminError                            nsqd or nsqlookupd refused an HTTP admin call
    ├── ClusterError                          the Spark connector's cluster calls failed
    │   ├── DataLoss                          offsets a read needs are gone from the queue
    │   └── PartitionUnavailable              no usable leader within leaderTimeout
    ├── RealNsqdError (also RuntimeError)     a real server binary missing or not starting
    └── ServerError                           the server answered with an error frame
        ├── RefreshLookupError                the cluster moved: refresh lookup, then retry
        ├── RetriableServerError              transient: retry as is
        └── NonRetriableServerError           the request itself is wrong: give up

A server error's *meaning* is fixed by its code (``ERROR_TABLE``); whether it is *fatal*
(the server closes the connection after sending it) depends on the code and, for a few codes,
on the command that caused it: ``E_FAILED_ON_NOT_LEADER`` is fatal after SUB or FIN but not
after PUB (``docs/errors.md`` has the table and its sources). Callers branch on ``action`` and
``fatal``, never on the text.

Every error class carries the same three flags, so callers branch on them, never on the class
or the text (``docs/errors.md`` has the table):

* ``fatal``: the connection it happened on is closed or unusable;
* ``retriable``: the same call may succeed if made again (elsewhere, later);
* ``refresh_lookup``: look the topic up again before retrying.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = [
    "CERTIFICATE_ALERTS",
    "ERROR_TABLE",
    "VERSION_ALERTS",
    "Action",
    "AdminError",
    "AlreadyResponded",
    "AlreadyRespondedAssertion",
    "AnswerTooLarge",
    "ClientCertificateRefused",
    "ClientClosed",
    "ClusterError",
    "ConnectionClosed",
    "ConnectionFailed",
    "DataLoss",
    "ErrorSpec",
    "HttpClosed",
    "HttpConnectError",
    "HttpConnectTimeout",
    "HttpError",
    "HttpTLSError",
    "HttpTimeout",
    "InvalidArgument",
    "InvalidArgumentAssertion",
    "LookupFailed",
    "LookupTimeout",
    "LookupdError",
    "LookupdRequestFailed",
    "LoopTimeout",
    "NSQError",
    "NoLeader",
    "NodeBackoff",
    "NonRetriableServerError",
    "NotHttp",
    "NotWritable",
    "PartitionUnavailable",
    "PlaintextAuthRefused",
    "ProducerClosed",
    "ProtocolError",
    "RealNsqdError",
    "RefreshLookupError",
    "RetriableServerError",
    "SecurityError",
    "ServerError",
    "TLSNotOffered",
    "TLSVerificationFailed",
    "TLSVersionRefused",
    "Timeout",
    "TopicNotFound",
    "TopicNotWritable",
    "certificate_refusal",
    "error_from_payload",
    "parse_error_payload",
]


class NSQError(Exception):
    """Base of every smartnsq error; see the module docstring for the three flags."""

    fatal: bool = False
    retriable: bool = False
    refresh_lookup: bool = False


class InvalidArgument(NSQError, ValueError):
    """A value broke a protocol rule; raised before anything is sent.

    ``field`` names the argument and ``rule`` says what it must satisfy.
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"invalid {field} {shown}: {rule}")


class InvalidArgumentAssertion(InvalidArgument, AssertionError):
    """A bad argument to the pynsq layer (``smartnsq.compat.pynsq``): a Reader, Writer, their
    setters or ``run()``.

    pynsq checks its arguments with ``assert``, so pynsq programs catch ``AssertionError``;
    smartnsq code catches :class:`InvalidArgument` (a ``ValueError``). Being both keeps either
    kind of caller working.
    """


class ProtocolError(NSQError):
    """The peer sent bytes that cannot be a valid NSQ stream (or exceeded a limit, or switched
    on a feature that was not negotiated); the connection is closed."""

    fatal = True


class HttpError(ProtocolError):
    """The peer's answer is not HTTP/1.1 this client can read, or breaks a bound."""


class NotHttp(HttpError):
    """The peer answered with something that is not HTTP at all; ``found`` says what it looks
    like (``diagnose.describe_start``: an NSQ frame, an HTML page, some text...), never more
    than its first line."""

    def __init__(self, found: str) -> None:
        self.found = found
        super().__init__(f"not an HTTP/1.x status line: answered with {found}")


class AnswerTooLarge(HttpError):
    """The answer's body is over ``limit`` bytes: ``declared`` when its ``Content-Length``
    said so (nothing of it read), ``None`` when the bytes themselves went past it."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        self.limit = limit
        self.declared = declared
        if declared is not None:
            text = f"answer of {declared} bytes is over the limit of {limit} bytes"
        else:
            text = f"answer of more than {limit} bytes"
        super().__init__(text)


class ConnectionFailed(NSQError):
    """The connection failed; the request may or may not have reached the server."""

    fatal = True
    retriable = True


class ConnectionClosed(ConnectionFailed):
    """The connection closed while calls were pending."""


class ClientClosed(ConnectionFailed, RuntimeError):
    """A call on a client (a ``smartnsq.sync`` facade) after its ``close()``: nothing was
    sent. Also a ``RuntimeError``, which is what these calls raised before."""

    retriable = False


class ProducerClosed(ConnectionFailed):
    """close() began before this attempt was written: it fails, nothing was sent (retrying on
    this producer cannot help: it is closing)."""

    retriable = False


class NodeBackoff(ConnectionFailed):
    """A node's connect failed recently; it will not be dialled again for ``retry_in`` s."""

    def __init__(self, address: tuple[str, int], retry_in: float,
                 cause: BaseException | None, name: str | None = None) -> None:
        self.address = address
        self.retry_in = retry_in
        self.cause = cause  # the connect failure the node is backing off from
        # ``name``: the node as messages name it (``unix:PATH`` for a socket node)
        super().__init__(f"{name or f'{address[0]}:{address[1]}'} is backing off for "
                         f"{retry_in:.2f}s after failing to connect: {cause}")


class _PeerError(Exception):
    """``peer`` (``host:port``) and ``reason`` kept apart, so callers can name the peer their
    own way."""

    def __init__(self, peer: str, reason: str) -> None:
        self.peer = peer
        self.reason = reason
        super().__init__(f"{peer}: {reason}")


class HttpConnectError(_PeerError, ConnectionFailed):
    """The TCP connection could not be made (refused, unreachable, name not resolved)."""


class HttpTLSError(_PeerError, ConnectionFailed):
    """The TLS handshake failed, or the peer's certificate was refused."""


class HttpClosed(_PeerError, ConnectionFailed):
    """The peer closed or reset the connection before its answer was whole."""


class Timeout(NSQError, TimeoutError):
    """A call did not complete before its deadline. The connection stays open: a late
    answer is discarded (``smartnsq.transport.connection``)."""

    retriable = True


class LoopTimeout(Timeout):
    """A blocking wait ran out before the call on the loop finished (the call was cancelled).

    Distinct from the call's own errors: a call that keeps its deadline raises its own
    ``smartnsq.errors.Timeout`` first, so this means the loop thread was blocked or the call
    overran its deadline.
    """


class HttpTimeout(_PeerError, Timeout):
    """No whole answer within the request's deadline (or no connection within the connect
    deadline)."""


class HttpConnectTimeout(HttpTimeout):
    """No connection (TCP, then TLS) within the connect deadline."""


class SecurityError(NSQError):
    """Going on would be unsafe; the connection is closed and retrying cannot help until the
    configuration changes."""

    fatal = True


class TLSVerificationFailed(SecurityError):
    """The server's TLS certificate was refused (untrusted CA, wrong host name, expired...);
    ``reason`` is the verifier's one-line explanation."""

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"TLS certificate of {address} refused: {reason} (set tls_ca_file "
                         "to the CA that signed it, or tls_server_hostname to the name it "
                         "carries)")


#: The OpenSSL reasons of the TLS alerts a server sends when it refuses the client's
#: certificate (missing, untrusted, expired, revoked, unusable): a configuration to change,
#: not a lost connection to retry. Go's nsqd sends ``bad certificate``; OpenSSL servers
#: send ``certificate required`` (TLS 1.3) for a missing one.
CERTIFICATE_ALERTS = frozenset({
    "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "TLSV1_ALERT_UNKNOWN_CA",
})


class ClientCertificateRefused(SecurityError):
    """The server refused this client's TLS certificate (none was configured, or it is not
    signed by a CA the server trusts, or expired): its TLS alert arrived. Refused at once, as
    a refused server certificate is; ``reason`` is the alert's name."""

    retriable = False

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"{address} refused this client's TLS certificate ({reason}); give "
                         "the context a certificate the server's CA signed "
                         "(load_cert_chain)")


class TLSVersionRefused(SecurityError):
    """No TLS version both ends accept (the server's ``--tls-min-version`` above the
    client's maximum, or the reverse): its alert arrived. Refused at once: both ends' settings
    decide, so every retry meets the same alert; ``reason`` is the alert's name."""

    retriable = False

    def __init__(self, address: str, reason: str) -> None:
        self.address = address
        self.reason = reason
        super().__init__(f"{address} and this client share no TLS version ({reason}); "
                         "allow the server's (tls_min_version, the context's maximum_version)")


VERSION_ALERTS = frozenset({"TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL",
                            "NO_PROTOCOLS_AVAILABLE"})


def certificate_refusal(address: str, exc: BaseException | None) -> SecurityError | None:
    """``ClientCertificateRefused`` or ``TLSVersionRefused`` when ``exc`` (what ended a
    connection or its TLS handshake) is the TLS alert refusing our certificate or our
    versions, else ``None``; a pure classification of ``ssl.SSLError.reason``, so the
    connection's two places agree."""
    reason = getattr(exc, "reason", None)
    if isinstance(exc, OSError) and reason in CERTIFICATE_ALERTS:
        return ClientCertificateRefused(address, str(reason))
    if isinstance(exc, OSError) and reason in VERSION_ALERTS:
        return TLSVersionRefused(address, str(reason))
    return None


class TLSNotOffered(SecurityError, ConnectionFailed):
    """TLS was asked for and required (``tls_required``), and the server answered IDENTIFY
    without it (``tls_v1: false``): a server without TLS, or someone stripping it on the way.
    Refused at once, as a refused certificate is: retrying meets the same answer. (Also a
    ``ConnectionFailed``, which it was before; its flags are a ``SecurityError``'s.)"""

    fatal = True
    retriable = False

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__(f"{address} does not offer TLS (tls_v1:false); set "
                         "tls_required=False to go on in plaintext")


class PlaintextAuthRefused(SecurityError):
    """The server asked for AUTH over a connection without TLS: the secret is not sent."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__(f"{address} asks for AUTH but the connection is not encrypted: the "
                         "secret was not sent (use tls=True, or set "
                         "ConnectionConfig(allow_plaintext_auth=True) to send it in the clear)")


class LookupFailed(NSQError):
    """No nsqlookupd answered usefully; not ``retriable`` when every lookupd answered as some
    other server (nsqd's ports, a web server): a configuration error, not a fault to wait out."""

    retriable = True

    def __init__(self, *args: object, retriable: bool | None = None) -> None:
        super().__init__(*args)
        if retriable is not None:
            self.retriable = retriable


class LookupTimeout(LookupFailed, Timeout):
    """A lookup found no answer within the caller's deadline (``view(timeout=...)``); both a
    ``LookupFailed`` and a ``Timeout``."""

    retriable = True


class LookupdError(LookupFailed):
    """One lookupd answered with an error (or garbage); ``status`` is the effective status.

    ``retriable`` is false for answers that would come back the same (a 4xx about the
    request itself), true for server-side failures worth asking again or elsewhere.
    """

    def __init__(self, status: int, message: str, *, retriable: bool | None = None) -> None:
        self.status = status
        self.message = message
        self.retriable = status >= 500 or status == 0 if retriable is None else retriable
        super().__init__(f"lookupd answered {status}: {message}")


class LookupdRequestFailed(LookupdError):
    """One request to one lookupd came to nothing usable: no connection, no whole answer
    within the lookup's ``timeout``, TLS refused, or bytes that are not a lookupd's answer.

    A ``LookupFailed`` raised because no lookupd answered has its last round's last failure as
    ``__cause__``: this, or a ``LookupdError`` with the status a lookupd answered. ``lookupd``
    is the address, ``state`` how it failed (``timeout``, ``refused``, ``tls``, ``malformed``,
    ``error``: as in ``LookupdStatus.state``); there was no status to read, so ``status`` is
    0; ``retriable`` unless the peer answered as some server other than nsqlookupd.
    """

    def __init__(self, lookupd: str, state: str, reason: str, *,
                 retriable: bool = True) -> None:
        self.lookupd = lookupd
        self.state = state
        super().__init__(0, f"{lookupd}: {reason}", retriable=retriable)
        self.args = (f"{lookupd}: {reason}",)  # no status to show: none was answered


class TopicNotFound(LookupFailed):
    """The lookupds agree the topic does not exist (it must be created first on youzan NSQ)."""

    retriable = False

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"topic {topic!r} not found in lookup")


class TopicNotWritable(TopicNotFound):
    """The topic exists but has no channel yet, so lookupd shows no writable partition.

    A youzan lookupd hides, from ``access=w`` lookups, every partition without a channel:
    create a channel (or start a consumer) before publishing.
    """

    def __init__(self, topic: str, message: str = "") -> None:
        self.topic = topic
        self.message = message
        LookupFailed.__init__(self, f"topic {topic!r} has no channel yet, so no partition is "
                                    f"writable: create a channel or subscribe first ({message})")


class NoLeader(NSQError):
    """The wanted partition (or any node, unpinned) has no leader in the current routes, and
    lookup names none at all: an election under way, or every replica down. Wait for one (the
    call retries by itself within its deadline)."""

    retriable = True
    refresh_lookup = True


class NotWritable(NoLeader):
    """The wanted partition has a leader, up and named to readers, that takes no writes now
    (youzan lookupd hides it from writers): too few in-sync replicas, a leader change, or
    writes disabled by an operator. Retried like ``NoLeader``; if it lasts, the partition's
    replicas (or ``nsqadmin``'s write switch) need looking at, not the client."""


class AlreadyResponded(NSQError, RuntimeError):
    """``fin()``/``req()``/``touch()`` on a message that was already finished or requeued."""


class AlreadyRespondedAssertion(AlreadyResponded, AssertionError):
    """A second answer to a message of the pynsq layer, where pynsq asserts (its callers
    catch ``AssertionError``)."""


class AdminError(NSQError):
    """An nsqd or nsqlookupd refused an administrative request.

    ``status`` is the effective HTTP status (the wrapped form's ``status_code`` when the
    answer was wrapped), ``message`` the server's text and ``code`` its first token (youzan
    prefixes coordinator errors with ``ErrType:N ErrCode:N :``; that prefix is skipped).
    ``not_leader`` says the request went to a node that does not lead (a lookupd that is not
    the leader, or an nsqd that does not lead the partition): ask the leader instead.
    ``retriable`` is true when the same request may succeed later (the cluster is moving, or
    the server failed), false when it would be refused again.
    """

    def __init__(self, status: int, message: str, *, what: str = "", address: str = "") -> None:
        self.status = status
        self.message = message
        self.what = what
        self.address = address
        self.code = _admin_code(message)
        spec = ERROR_TABLE.get(self.code)  # the cluster moving: the TCP codes' own rule
        self.retriable = status >= 500 or self.not_leader or (
            spec is not None and spec.action is Action.REFRESH_AND_RETRY)
        where = f"{what} on {address}" if what and address else what or address or "request"
        super().__init__(f"{where} refused: HTTP {status} {message}".rstrip())

    @property
    def not_leader(self) -> bool:
        return self.code == "E_FAILED_ON_NOT_LEADER" or "Not nsqlookup leader" in self.message


_ADMIN_CODE = re.compile(r"[A-Z][A-Z0-9_]+")


def _admin_code(message: str) -> str:
    text = message.strip()
    if text.startswith("ErrType:") and " : " in text:
        text = text.split(" : ", 1)[1].strip()
    token = text.split(" ", 1)[0]
    # an error token (E_FAILED_ON_NOT_LEADER, INVALID_ARG_TOPIC); prose stays whole
    return token if _ADMIN_CODE.fullmatch(token) else text


class ClusterError(NSQError):
    """The cluster refused or failed an HTTP call the connector needed.

    ``transient`` marks what a leader change or a node's restart explains (connection
    refused or reset, an HTTP timeout, ``E_FAILED_ON_NOT_LEADER``, a node that no longer leads
    the partition): the connector retries those until ``leaderTimeout``.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class DataLoss(ClusterError):
    """Offsets a read needs are no longer in the partition's queue (retention, a reset)."""

    def __init__(self, topic: str, partition: int, start: int, first: int) -> None:
        super().__init__(
            f"{topic}/{partition}: offsets {start}..{first} are no longer in the queue "
            "(retention or a reset removed them); fix: set failOnDataLoss=false to skip "
            "them (logged as a warning), or start from a retained offset")


class PartitionUnavailable(ClusterError):
    """A partition had no leader serving reads for longer than ``leaderTimeout``."""

    def __init__(self, topic: str, partition: int | None, condition: str,
                 waited: float) -> None:
        where = topic if partition is None else f"{topic}/{partition}"
        super().__init__(
            f"{where} had no usable leader for {waited:.0f}s ({condition}); fix: bring its "
            "nsqd back, or let the cluster elect a leader and enable consumption on it, or "
            "raise the leaderTimeout option")
        self.topic = topic
        self.partition = partition
        self.condition = condition


class RealNsqdError(NSQError, RuntimeError):
    """A real server could not be found or started (the message holds its log's tail)."""


class Action(enum.Enum):
    """What a client does about a server error."""

    REFRESH_AND_RETRY = "refresh lookup, then retry"
    RETRY = "retry as is"
    GIVE_UP = "give up: the request or configuration is wrong"


@dataclass(frozen=True)
class ErrorSpec:
    """One row of the error table.

    ``fatal_on`` lists the commands after which the server closes the connection;
    ``None`` means after every command.
    """

    code: str
    action: Action
    fatal_on: frozenset[str] | None
    meaning: str

    def is_fatal(self, command: str | None) -> bool:
        if self.fatal_on is None:
            return True
        return command is not None and command in self.fatal_on


_SUB_CMDS = frozenset({"SUB", "SUB_ORDERED", "SUB_ADVANCED"})
_PUB_CMDS = frozenset({"PUB", "MPUB", "DPUB", "PUB_TRACE", "MPUB_TRACE", "PUB_EXT", "MPUB_EXT"})
_NEVER: frozenset[str] = frozenset()
_ALWAYS = None


def _row(code: str, action: Action, fatal_on: frozenset[str] | None, meaning: str) -> ErrorSpec:
    return ErrorSpec(code, action, fatal_on, meaning)


_R, _T, _G = Action.REFRESH_AND_RETRY, Action.RETRY, Action.GIVE_UP


ERROR_TABLE: dict[str, ErrorSpec] = {
    s.code: s
    for s in (
        _row("E_FAILED_ON_NOT_LEADER", _R, _SUB_CMDS | {"FIN"},
             "this node no longer leads the partition"),
        _row("E_FAILED_ON_NOT_WRITABLE", _R, _SUB_CMDS | {"FIN"},
             "the partition cannot take writes now (election, ISR, write disabled)"),
        _row("E_TOPIC_NOT_EXIST", _R, _ALWAYS,
             "the topic or partition is not on this node"),
        _row("E_PUB_FAILED", _T, _NEVER, "the write failed locally; transient"),
        _row("E_MPUB_FAILED", _T, _NEVER, "the batch write failed locally; transient"),
        _row("E_PUB_TOO_MUCH_WAITING", _T, _ALWAYS,
             "publish back-pressure; back off and reconnect"),
        _row("too much client connections", _T, _ALWAYS,
             "the node is at its connection limit; back off and reconnect"),
        _row("E_BAD_PARTITION", _G, _ALWAYS,
             "partition missing or invalid (ordered topics need an explicit partition)"),
        _row("E_SUB_ORDER_IS_MUST", _G, _ALWAYS, "ordered topics must use SUB_ORDERED"),
        _row("E_SUB_EXTEND_NEED", _G, _ALWAYS,
             "ext topic: IDENTIFY with extend_support true"),
        _row("E_SUB_EXTEND_FORBIDDON", _G, _ALWAYS,
             "non-ext topic: IDENTIFY with extend_support false"),
        _row("E_SUB_CHANNEL_NOT_REGISTERED", _G, _ALWAYS,
             "the channel must be registered by an operator first"),
        _row("E_EXT_NOT_SUPPORT", _G, _NEVER, "headers sent to a topic without ext support"),
        _row("E_INVALID_JSON_HEADER", _G, _NEVER, "the ext header is not a JSON object"),
        _row("INVALID_TRACE_ID", _G, _NEVER, "##trace_id is not a decimal uint64 string"),
        _row("E_INVALID", _G, _ALWAYS,
             "protocol misuse: bad state, out-of-range value or unknown command"),
        _row("E_BAD_TOPIC", _G, _ALWAYS, "invalid topic name"),
        _row("E_BAD_CHANNEL", _G, _ALWAYS, "invalid channel name"),
        _row("E_BAD_MESSAGE", _G, _ALWAYS, "message empty or larger than max_msg_size"),
        _row("E_BAD_BODY", _G, _ALWAYS, "malformed or oversized command body"),
        _row("E_BAD_PROTOCOL", _G, _ALWAYS, "the magic was not '  V2'"),
        _row("E_IDENTIFY_FAILED", _G, _ALWAYS, "IDENTIFY asked for incompatible features"),
        _row("E_AUTH_FIRST", _G, _ALWAYS, "the server requires AUTH before this command"),
        _row("E_AUTH_FAILED", _G, _ALWAYS, "the auth server refused the secret"),
        _row("E_UNAUTHORIZED", _G, _ALWAYS, "the secret does not allow this topic/channel"),
        _row("E_AUTH_DISABLED", _G, _ALWAYS, "AUTH sent to a server without auth"),
        _row("E_AUTH_ERROR", _G, _ALWAYS, "the auth server could not be asked"),
        _row("E_FIN_FAILED", _G, _NEVER,
             "the message is not in flight here (timed out or already answered)"),
        _row("E_REQ_FAILED", _G, _NEVER,
             "the message is not in flight here, or requeued too often"),
        _row("E_TOUCH_FAILED", _G, _NEVER, "the message is not in flight here"),
        _row("E_CREATE_TOPIC_FAILED", _G, _NEVER, "INTERNAL_CREATE_TOPIC refused (cluster mode)"),
        _row("E_BAD_EXT", _G, _ALWAYS, "INTERNAL_CREATE_TOPIC ext flag invalid"),
        _row("E_TAG_NOT_SUPPORT", _G, _ALWAYS, "tag dispatch not supported (old servers)"),
        _row("E_BAD_TAG", _G, _ALWAYS, "invalid dispatch tag (old servers)"),
    )
}


_UNKNOWN = ErrorSpec("", Action.GIVE_UP, _ALWAYS, "unknown error code")


def parse_error_payload(payload: bytes) -> tuple[str, str]:
    """Split an error frame into (code, text).

    The code is everything before the first space; the description may be empty
    (``b"E_TOPIC_NOT_EXIST "``). The connection-limit error has no code at all and is
    returned whole as its own code.
    """
    text = bytes(payload).decode("utf-8", "replace")
    if text.startswith("too much client connections"):
        return "too much client connections", ""
    code, _, rest = text.partition(" ")
    return code, rest


class ServerError(NSQError):
    """An error frame from nsqd.

    ``code`` is the server's code, ``text`` its description, ``command`` the command that
    caused it (when known), ``fatal`` whether the server closes the connection after it.
    """

    action: Action = Action.GIVE_UP
    retriable = False  # per class below, from its action
    refresh_lookup = False

    def __init__(self, code: str, text: str = "", command: str | None = None,
                 *, fatal: bool | None = None, node: str | None = None) -> None:
        self.code = code
        self.text = text
        self.command = command
        self.node = node
        self.spec = ERROR_TABLE.get(code, _UNKNOWN)
        self.fatal = self.spec.is_fatal(command) if fatal is None else fatal
        where = f" (after {command})" if command else ""
        sender = f" from nsqd {node}" if node else ""
        super().__init__(f"{code} {text}".rstrip() + where + sender)

    def from_node(self, node: str) -> ServerError:
        """The same error, saying which nsqd sent it: for errors that reach a caller with no
        request of theirs around them (a fatal frame in the handshake), where nothing else
        tells which of several nodes refused."""
        if self.node is not None:
            return self
        named = type(self)(self.code, self.text, self.command, fatal=self.fatal, node=node)
        named.__cause__ = self.__cause__
        return named


class RefreshLookupError(ServerError):
    action = Action.REFRESH_AND_RETRY
    retriable = True
    refresh_lookup = True


class RetriableServerError(ServerError):
    action = Action.RETRY
    retriable = True


class NonRetriableServerError(ServerError):
    action = Action.GIVE_UP


_CLASS_FOR_ACTION: dict[Action, type[ServerError]] = {
    Action.REFRESH_AND_RETRY: RefreshLookupError,
    Action.RETRY: RetriableServerError,
    Action.GIVE_UP: NonRetriableServerError,
}


def error_from_payload(payload: bytes, command: str | None = None) -> ServerError:
    """Build the typed error for an error frame's payload."""
    code, text = parse_error_payload(payload)
    spec = ERROR_TABLE.get(code, _UNKNOWN)
    return _CLASS_FOR_ACTION[spec.action](code, text, command)
