"""smartnsq's sans-I/O core: NSQ bytes in, typed values out, and commands to bytes.

Nothing here touches sockets, event loops, threads or clocks, so every layout is tested in
memory. Connections feed received bytes to ``FrameReader`` and write what ``commands`` builds.
"""

from . import commands, validate
from .commands import MAGIC_V2, StartPosition
from .frames import (
    CLASSIC_LAYOUT,
    HEARTBEAT,
    YOUZAN_LAYOUT,
    ErrorFrame,
    Frame,
    FrameReader,
    Heartbeat,
    Message,
    MessageLayout,
    Response,
    encode_error,
    encode_frame,
    encode_message,
    encode_response,
    partition_of,
    youzan_message_id,
)
from .identify import IdentifyOptions
from .responses import (
    AuthResponse,
    IdentifyResponse,
    PublishReceipt,
    parse_auth_response,
    parse_identify_response,
    parse_publish_response,
)

__all__ = [
    "CLASSIC_LAYOUT",
    "HEARTBEAT",
    "MAGIC_V2",
    "YOUZAN_LAYOUT",
    "AuthResponse",
    "ErrorFrame",
    "Frame",
    "FrameReader",
    "Heartbeat",
    "IdentifyOptions",
    "IdentifyResponse",
    "Message",
    "MessageLayout",
    "PublishReceipt",
    "Response",
    "StartPosition",
    "commands",
    "encode_error",
    "encode_frame",
    "encode_message",
    "encode_response",
    "parse_auth_response",
    "parse_identify_response",
    "parse_publish_response",
    "partition_of",
    "validate",
    "youzan_message_id",
]
