"""Classic NSQ fallback and pynsq-style API (shipped as ``smartnsq.compat``)."""
