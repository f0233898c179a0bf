"""``ClassicPolicy``: what youzan-only features become on classic nodes.

The policy is pure and the core's default, so it lives in :mod:`smartnsq.dialect` beside the
hook interface the clients call; this module keeps its public compat name.
"""

from smartnsq.dialect import (
    DEFAULT_POLICY,
    ClassicPolicy,
    ClassicSubscription,
    key_for_hash,
    rendezvous,
)

__all__ = ["DEFAULT_POLICY", "ClassicPolicy", "ClassicSubscription", "key_for_hash", "rendezvous"]
