"""smartnsq: a partition-aware smart client for youzan's redesigned NSQ (and classic NSQ)."""

__version__ = "0.1.0"
