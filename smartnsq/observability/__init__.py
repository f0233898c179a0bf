"""Floor 2: what the clients count and how it is reported.

``counters`` (what the hot paths touch), ``stats`` (the typed snapshots ``stats()`` returns),
``trace`` (the trace log), ``logs`` (the library's logging), ``otel`` and ``otel_metrics``
(OpenTelemetry, the ``otel`` extra) and ``prometheus`` (a collector, the ``prometheus``
extra). Nothing here opens a socket or knows a client class: the clients hand their counters in.
"""
