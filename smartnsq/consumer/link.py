"""One subscribed connection as the messages it delivered see it: delivery and answers.

The connection decodes frames straight into :class:`smartnsq.message.Message` and calls
:meth:`Link.on_message` inside ``data_received``. A plain-function handler with a free slot
and nothing queued ahead runs right there (``Runtime.run_now``: no queue, no task wake-up,
no extra loop turn); otherwise the message goes on the dispatch queue for the workers (no
task per message). Ordered subscriptions have a *lane*: while one of the partition's
messages is being handled the next ones wait behind it, so a sharding key's messages are
handled in publish order whatever the concurrency.

Answers (``Message.fin()/req()`` and the consumer's own) settle the message's state machine
(``smartnsq.message``: PENDING, then FINISHED or REQUEUED, with a claim in between when the
answer comes from another thread) and queue FIN/REQ on the connection, which leaves in one
write per event-loop iteration; an ordered FIN is written at once (nothing can join it: the
partition's next message waits for it). Everything the links of one consumer share (counters, the
flow control, the dispatch queue, switches) is in one :class:`Runtime` passed to each.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Final

from ..errors import ConnectionClosed, ProtocolError
from ..message import (
    FINISHED,
    PENDING,
    REQUEUED,
    CopyFins,
    Message,
    claimed,
    names_message_id,
)
from ..model.partitions import fin_at_once
from ..model.rdy import NOTHING
from ..observability import trace as tracing
from ..protocol import body_compression, commands
from ..protocol.body_compression import MARK
from ..transport.connection import Connection
from .runtime import Runtime

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..errors import ServerError

__all__ = ["Link", "link_of"]

log = logging.getLogger("smartnsq.consumer")
trace_log = tracing.trace_log

_INFO: Final = logging.INFO
_MAX_REQ_DELAY_MS: Final = 3_600_000 * 72  # youzan's max_req_timeout default (72 h)
_CLAIM_LOCK: Final = threading.Lock()  # answers given from threads other than the loop's
_NO_TRACE: Final = b"\x00" * 8
_FIRST: Final = b"\xff" * 9  # last_id before the first delivery: above every 8-byte id
# last_offset while the next delivery has something to judge (a FIN's refusal is held, or a
# jump is undecided): above every queue offset, so that delivery takes the checked path
_JUDGE: Final = 1 << 64


def _ms(seconds: float) -> int:
    return min(_MAX_REQ_DELAY_MS, max(0, round(seconds * 1000)))


class Link:
    """One subscribed connection: the responder of the messages it delivered."""

    __slots__ = (
        "_fin", "_req", "_send", "_send_now", "back", "back_id", "back_offset", "channel",
        "conn", "copy_fins", "counts", "dead", "detail", "dropped_copy", "first_id",
        "held_offset", "in_flight", "jump", "lane", "lane_busy", "last", "last_id",
        "last_offset", "local", "node", "ordered", "partition", "rdy", "rdy_cap", "report",
        "rewind", "rt", "topic", "youzan",
    )

    def __init__(self, rt: Runtime, conn: Connection, partition: int | None, *, ordered: bool,
                 detail: bool, rdy_cap: int | None = None,
                 report: Callable[[ServerError], None] | None = None) -> None:
        self.rt = rt
        self.rdy_cap = rdy_cap
        self.conn = conn
        self.topic = rt.topic
        self.channel = rt.channel
        self.node = conn.address_text
        self.partition = partition
        self.youzan = conn.is_youzan
        self.ordered = ordered
        self.detail = detail
        self.in_flight = 0  # delivered, not yet answered
        self.dead = False  # closed() ran: answers are dropped
        self.rdy = 0  # last RDY sent
        self.lane: deque[Message] = deque()  # ordered: messages waiting behind the busy one
        self.lane_busy = False
        # internal id as 8 big-endian bytes: they compare as the integers. _FIRST is above
        # every id, so the first delivery takes the checked path (_check_order)
        self.last_id = _FIRST
        self.first_id = _FIRST  # the link's first delivery's (set there)
        self.last_offset = -1
        self.last: Message | None = None  # the delivery last_id came with (detail only)
        # duplicate copies FINed after their original (ordered), whose FINs may be answered
        # E_FIN_FAILED (expected_error)
        self.copy_fins = CopyFins()
        # the id of a copy dropped while its original was unanswered: if the original's FIN
        # then fails E_FIN_FAILED, the server counts the copy in flight instead (it recorded it
        # after that FIN): FINed once more (expected_error)
        self.dropped_copy = b""
        self.report = report  # counts and logs a server error (the subscription's): _release
        self.held_offset = -1  # the true last_offset while it is _JUDGE
        # an undecided jump (_jump): the message that went back (or was out of order), the
        # position before it (restored when the next delivery goes on from there) and, for a
        # jump shaped like a rewind, its text ("" once decided, or for an order error)
        self.jump: Message | None = None
        self.back: Message | None = None
        self.back_id = b""
        self.back_offset = -1
        self.rewind = ""
        self.local = conn.local_address
        self.counts = rt.meter.partition(partition)  # the partition's, over its connections
        self._send = conn.send
        # an ordered FIN cannot be joined by anything (one in flight; the next message waits
        # for it): written in the same turn; a plain FIN waits for the turn's batch
        self._send_now = conn.send_now if fin_at_once(ordered) else conn.send
        self._fin = commands.fin
        self._req = commands.req

    @property
    def alive(self) -> bool:
        return not self.conn.is_closed

    def send_rdy(self, count: int) -> None:
        if self.conn.is_closed:
            return
        self.rdy = count
        self._send(commands.rdy(count))

    # -- delivery (inside data_received) ------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        rt = self.rt
        if self.detail:
            iid = msg.id[:8]
            offset = msg.queue_offset
            if iid > self.last_id and offset is not None and offset >= self.last_offset \
                    and (self.ordered or msg.attempts <= 1):
                # in order (the per-message case): note it, nothing to check further
                self.last_id = iid
                self.last_offset = offset
                self.last = msg
            elif self._check_order(msg, iid):
                return
        ext = msg.ext
        if ext is not None and MARK in ext and rt.config.decompress:
            self._decompress(msg, ext)  # a body the publisher compressed (rare)
        msg._responder = self
        msg._state = PENDING
        msg._auto = rt.auto_finish
        self.in_flight += 1
        rt.in_flight += 1
        self.counts.received += 1  # (the consumer's total is the partitions' sum)
        # the controller directly (flow.Flow has no per-message method)
        cmds = rt.flow.ctl.on_message(self, self.conn.last_receive)
        if cmds:
            rt.flow.apply(cmds)
        trace = rt.trace
        if trace is not False and (trace or (msg.youzan and msg.id[8:] != _NO_TRACE)) \
                and trace_log.isEnabledFor(_INFO):
            self._trace_line(msg)
        if rt.draining:
            # RDY 0 already went out; this one was on the wire: give it straight back
            self.settle(msg, REQUEUED, 0.0, False)
            return
        if self.ordered:
            if self.lane_busy:
                self.lane.append(msg)
                return
            self.lane_busy = True
        run = rt.run_now
        if run is not None and rt.suspended < rt.concurrency and not rt.queue.pending:
            run(msg, self)
        else:
            rt.queue.push(msg)

    def _decompress(self, msg: Message, ext: bytes) -> None:
        """Undo the publisher's compression of the body (youzan/go-nsq's marks), in place,
        before anything reads the message. A body that cannot be decoded stays as stored and
        is noted for the workers, which requeue it or hand it to the give-up hook: it is
        never handled, and never FINed unseen."""
        if msg.ext_version != 4:
            return
        try:
            decoded = body_compression.unpack(ext, msg.body, self.rt.config.max_decompressed_size)
        except ProtocolError as exc:
            msg._body_error = exc
            self.rt.undecoded.add(msg)
            return
        if decoded is not None:
            msg.body, msg.ext = decoded

    def _check_order(self, msg: Message, iid: bytes) -> bool:
        """Order checks of SUB_ORDERED/SUB_ADVANCED subscriptions (``iid``: the internal id's
        8 bytes); True for a copy to drop."""
        if self.last is None:
            # the link's first delivery (_FIRST brought it here): the one the real server
            # may send twice (_duplicate)
            self.first_id = iid
            self.last_id = iid
            self.last_offset = msg.queue_offset if msg.queue_offset is not None else -1
            self.last = msg
            return False
        if msg.attempts > 1 and not self.ordered:
            return False  # a requeued or timed-out message comes back after newer ones: normal
        if self.last_offset == _JUDGE:
            self.last_offset = self.held_offset  # (_JUDGE brought this delivery here)
        offset = msg.queue_offset if msg.queue_offset is not None else -1
        if self.jump is not None and iid != self.last_id:
            self._decide(iid, offset)  # the delivery after a jump says what the jump was
        if iid == self.last_id:
            original = self.last
            assert original is not None  # last_id is set with it
            if self.ordered and msg.attempts <= original.attempts:
                drop = self._duplicate(msg, original)
            else:
                self.last = msg  # a redelivery of the same message
                drop = False
                if self.copy_fins.held is not None:  # back with attempts + 1: the FIN was late
                    self._release()
            if self.jump is not None:  # the jump's message again: the next one decides
                self._judge_next()
            return drop
        if iid < self.last_id or offset < self.last_offset:
            self._jump(msg, iid, offset)
        self.last_id = iid
        self.last_offset = offset
        self.last = msg
        if self.jump is not None:
            self._judge_next()
        if self.copy_fins.held is not None:
            self._release()
        return False

    def _jump(self, msg: Message, iid: bytes, offset: int) -> None:
        """``msg`` goes back (or its id and offset disagree): undecided until the next
        delivery, which :meth:`_decide` reads, with the position before it kept in ``back``.

        A fresh read (attempts 1) whose id and offset both go back is what the server sends
        after a setoffset back, and also what a verbatim copy of an earlier frame is: only
        what follows tells (a replay goes on from it, the server after a copy from where the
        partition was). Anything else is an order error at once, which becomes the position
        only when the partition goes on from it."""
        where = (f"{self.topic}/{self.partition} at {self.node}: internal_id "
                 f"{int.from_bytes(iid, 'big')} after {int.from_bytes(self.last_id, 'big')}, "
                 f"queue_offset {offset} after {self.last_offset}")
        self.jump, self.back = msg, self.last
        self.back_id, self.back_offset = self.last_id, self.last_offset
        if msg.attempts == 1 and iid < self.last_id and 0 <= offset < self.last_offset:
            log.debug("went back on %s: a rewind if the next delivery replays on from it", where)
            self.rewind = where
        else:
            self.rewind = ""
            self.rt.order_error(msg, f"order regression on {where}")

    def _decide(self, iid: bytes, offset: int) -> None:
        """The verdict on the undecided jump, from the delivery after it (``iid``, ``offset``:
        not the jump's message again). A rewind is confirmed unless the delivery goes on from
        before the jump, which makes it an order error; an order error becomes the position
        when the delivery comes right after it (id + 1, at its offset + raw_size). Otherwise
        the position before the jump is restored, for the delivery to be judged against."""
        jump, back, self.jump, self.back = self.jump, self.back, None, None
        assert jump is not None  # (the caller's test)
        where, self.rewind = self.rewind, ""
        after = int.from_bytes(iid, "big")
        if where:
            if not (iid > self.back_id and offset >= self.back_offset):
                log.info("rewound on %s (the channel was set back: replaying)", where)
                return
            self.rt.order_error(jump, f"order regression on {where} (no rewind: the next "
                                      f"delivery, internal_id {after} at queue_offset {offset}, "
                                      "goes on from before it)")
        else:
            raw = jump.raw_size
            if after == int.from_bytes(self.last_id, "big") + 1 and (
                    offset == self.last_offset + raw if raw else offset > self.last_offset):
                log.debug("%s/%s at %s goes on from the message out of order, internal_id %d",
                          self.topic, self.partition, self.node, after - 1)
                return
        self.last_id, self.last_offset, self.last = self.back_id, self.back_offset, back

    def _judge_next(self) -> None:
        """Send the next delivery to _check_order (the in-order test fails on _JUDGE)."""
        if self.last_offset != _JUDGE:
            self.held_offset, self.last_offset = self.last_offset, _JUDGE

    def _duplicate(self, msg: Message, original: Message) -> bool:
        """The same delivery again (same id, same attempts) on an ordered subscription: the
        real server sends the first message of a fresh ordered channel twice
        (``docs/devcluster.md``, "Real failure modes, on a clock"). True for a copy nobody
        handles.

        Whether the server counts the copy in flight depends on when it sent it: nsqd records a
        message in flight before writing it, and writes it even when the id is in flight
        already. So a copy that comes before any answer of ours to the original left is not in
        flight (answering it could only fail), while one that comes after our FIN may be: on an
        ordered channel nothing else comes until it is answered, and left alone it held its
        partition until msg_timeout (a backlog drain took 62 s instead of 2.3 s). That one is
        FINed too. The copy of a requeued original may be in flight as well: it is handled as a
        delivery (at-least-once; the requeued original comes back with attempts + 1).
        """
        state = original._state
        if state == REQUEUED:
            log.debug("%s: %r delivered again after its REQ; handled as a delivery",
                      self.node, msg)
            self.last = msg
            return False
        if state == FINISHED and original.id[:8] != self.first_id:
            # only the link's first delivery is ever sent twice: this is the channel set back
            # to exactly the message last handled, a replay to hand over like any other
            log.info("rewound on %s/%s at %s to the last message handled, internal_id %d: "
                     "handling it again", self.topic, self.partition, self.node,
                     int.from_bytes(original.id[:8], "big"))
            self.last = msg
            return False
        self.counts.duplicates += 1
        if state != FINISHED:
            # PENDING, or claimed by another thread but not sent yet: no FIN has left, so the
            # original was in flight when the server sent this copy
            log.debug("%s: %r delivered twice; the copy is dropped", self.node, msg)
            self.dropped_copy = msg.id
            return True
        # our FIN left before the copy came. A plain handler answers inside the read that
        # brought the original, so a copy in the same read was sent before that FIN and its
        # FIN fails; nothing here tells the two cases apart, and a needless FIN costs one
        # expected E_FIN_FAILED where a missing one costs msg_timeout
        log.debug("%s: %r delivered again after its FIN; the copy is FINed too", self.node, msg)
        refusals = 2
        if self.copy_fins.forgive(msg.id):
            # the original's FIN was refused before this copy came: the server had dropped the
            # original from flight (its reader's reset) and sends the copy in its place
            log.debug("%s: the refused FIN of %r was its duplicate delivery's (expected)",
                      self.node, msg)
            refusals = 1
        if not self.conn.is_closed:
            # either FIN of the id may be refused: the copy's (it was not in flight) or, when
            # the server had recorded the copy in the original's place, the original's
            self.copy_fins.expect(msg.id, refusals)
            self._send_now(self._fin(msg.id))
        return True

    def expected_error(self, error: ServerError) -> bool:
        """True for the ``E_FIN_FAILED`` answering the FIN of a duplicate copy the server had
        not counted in flight (see :meth:`_duplicate`): expected, not a failure.

        Also for the FIN of an original whose copy was dropped while it was unanswered: on the
        real server the copy is then sometimes the one in flight (it was recorded after our
        FIN), and left alone it holds the ordered partition until msg_timeout; the
        id is FINed once more, and that FIN's own failure is expected too. And, held until
        the next delivery judges it, for the refused FIN of the message an ordered link
        delivered last (:meth:`CopyFins.hold`).
        """
        if error.code != "E_FIN_FAILED":
            return False
        if self.dropped_copy and names_message_id(error.text, self.dropped_copy):
            copy, self.dropped_copy = self.dropped_copy, b""
            if not self.conn.is_closed:
                log.debug("%s: the FIN of %r failed after its copy was dropped; FINed again",
                          self.node, copy)
                self.copy_fins.expect(copy)
                self._send_now(self._fin(copy))
            return True
        if self.copy_fins.absorbs(error):
            return True
        # an ordered link's refused FIN of the message it delivered last: judged by the next
        # delivery (a copy of it, or anything else: CopyFins.hold)
        last = self.last
        if not self.ordered or last is None or last._state != FINISHED \
                or not self.copy_fins.hold(error, last.id):
            return False
        # the next delivery goes through _check_order, which judges the refusal: no test of
        # it on the in-order path every message takes
        self._judge_next()
        return True

    def _release(self) -> None:
        """Report the held refusal: no copy came after it."""
        error = self.copy_fins.release()
        if error is not None and self.report is not None:
            self.report(error)

    def _trace_line(self, msg: Message) -> None:
        if msg.youzan:
            tracing.line("CONSUME", topic=self.topic, channel=self.channel,
                         partition=self.partition, node=self.node, local=self.local,
                         internal_id=msg.internal_id, trace_id=msg.trace_id,
                         queue_offset=msg.queue_offset, raw_size=msg.raw_size,
                         attempts=msg.attempts, timestamp=msg.timestamp)
        else:
            tracing.line("CONSUME", topic=self.topic, channel=self.channel, node=self.node,
                         local=self.local, id=msg.id.decode("ascii", "replace"),
                         attempts=msg.attempts, timestamp=msg.timestamp)

    # -- answers (Message.fin/req/touch land here) --------------------------------------------

    def answer(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        """``Message.fin()/req()``: the first answer wins, whatever the threads."""
        rt = self.rt
        if threading.get_ident() != rt.loop_thread_id:
            # claim under the lock (other threads), settle from the loop if still ours
            with _CLAIM_LOCK:
                if message._state != PENDING:
                    message._refuse()
                message._state = claimed(state)
            rt.loop.call_soon_threadsafe(self._settle_claimed, message, state, delay, backoff)
            return
        # the loop's own thread: nothing else runs here, no lock needed
        if message._state != PENDING:
            message._refuse()
        self.settle(message, state, delay, backoff)

    def _settle_claimed(self, message: Message, state: int, delay: float | None,
                        backoff: bool) -> None:
        if message._state != claimed(state):
            # the loop answered it (auto-answer, drain) between the claim and now
            log.debug("%s: a second answer to %r raced the first; dropped", self.node, message)
            return
        self.settle(message, state, delay, backoff)

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        """Settle ``message`` as FINISHED or REQUEUED and send the answer (the consumer's own
        answers come here directly; the handler's through :meth:`answer`)."""
        message._state = state
        rt = self.rt
        finish = state == FINISHED
        if self.dead:
            self._lost_answer("FIN" if finish else "REQ")
            return
        self.in_flight -= 1
        rt.in_flight -= 1
        flow = rt.flow
        if finish:
            rt.finished += 1
            # no is_closed check first (a property call per message): the write refuses a
            # closed connection itself, with the same ConnectionClosed
            try:
                self._send_now(self._fin(message.id))
            except ConnectionClosed:
                self._lost_answer("FIN")
            # the controller directly (flow.Flow has no per-message method)
            cmds = flow.ctl.on_finished(self, flow.now(), success=True)
        else:
            rt.requeued += 1
            self.counts.requeued += 1
            if self.conn.is_closed:
                self._lost_answer("REQ")
                cmds = flow.ctl.on_finished(self, flow.now(), success=False, backoff=backoff)
            elif self.ordered:
                # the server ignores a delayed REQ on ordered channels: the partition is held
                # at RDY 0 for the delay instead, sent before the REQ so nothing slips through
                flow.on_ordered_requeue(self, rt.requeue_delay(message) if delay is None
                                        else delay, backoff)
                self._send(self._req(message.id, 0))
                cmds = NOTHING  # (on_ordered_requeue sent the RDY and armed the deadline)
            else:
                wait = rt.requeue_delay(message) if delay is None else delay
                self._send(self._req(message.id, _ms(wait)))
                cmds = flow.ctl.on_finished(self, flow.now(), success=False, backoff=backoff)
        if cmds is not NOTHING:
            flow.answered(cmds)
        if self.ordered:  # the partition's next message, waiting behind this one
            lane = self.lane
            if lane:
                rt.queue.push(lane.popleft())
            else:
                self.lane_busy = False
        if rt.in_flight == 0 and rt.idle_waiter is not None:
            rt.check_idle()

    def _lost_answer(self, what: str) -> None:
        self.rt.lost_answers += 1
        log.debug("%s: %s of a message after its connection closed; the server redelivers it",
                  self.node, what)

    def touch(self, message: Message) -> None:
        rt = self.rt
        if threading.get_ident() != rt.loop_thread_id:
            rt.loop.call_soon_threadsafe(self._touch, message)
            return
        self._touch(message)

    def _touch(self, message: Message) -> None:
        if not self.conn.is_closed and message._state == PENDING:
            self._send(commands.touch(message.id))

    def give_back(self, message: Message) -> None:
        """Requeue at once, without back-off, a message nobody will handle (draining, an
        iteration that was left, a cancelled handler)."""
        if message._state == PENDING and not self.dead:
            self.settle(message, REQUEUED, 0.0, False)

    def closed(self) -> None:
        """The connection is gone: its messages can no longer be answered (the server
        redelivers them); forget them so in-flight counts stay true."""
        rt = self.rt
        self.dead = True
        self._release()
        if self.jump is not None:
            log.debug("%s: closed before the delivery that would say whether %s was a rewind",
                      self.node, self.rewind or "the message out of order")
            self.jump = self.back = None
            self.rewind = ""
        lost = self.in_flight
        if lost:
            rt.in_flight -= lost
            self.in_flight = 0
            self.counts.lost += lost
        self.lane.clear()
        self.lane_busy = False
        rt.check_idle()

    def __repr__(self) -> str:
        return f"<Link {self.node} {self.topic}/{self.partition} in_flight={self.in_flight}>"


def link_of(message: Message) -> Link:
    """The link that delivered ``message`` (set by :meth:`Link.on_message`)."""
    return message._responder  # type: ignore[return-value]

