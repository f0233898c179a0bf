"""Test infrastructure for smartnsq and for its users' tests (floor 6, beside the programs).

``pytest_plugin`` (the ``nsq_cluster`` / ``nsq_any_cluster`` fixtures), ``realcluster`` (the real
youzan and classic servers as processes, with ``DevCluster``'s interface), ``hostile`` (peers
that misbehave on purpose: silent, trickling, garbled) and ``spark`` (a dev cluster on a
background loop, for Spark jobs).
"""
