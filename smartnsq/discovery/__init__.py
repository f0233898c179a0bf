"""Floor 4: who leads which partition, and the connections to them.

``lookup`` (the lookup manager: topic views from every nsqlookupd, kept fresh), ``lookupds``
(the lookupds it asks: their health, asking them, learning the others), ``route_source``
(a lookup manager's writer views as routes), ``route_book`` (the publishers' routes, waits and
holds), ``chase`` (the consumers' chase after a moved leader), ``race`` (one request raced to
several lookupds) and ``nodes`` (one shared connection per nsqd).
"""
