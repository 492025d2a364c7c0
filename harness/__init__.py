"""Fault-injection tooling for the reliability tests (trio-native).

* ``proxy.FaultProxy``: a loopback TCP proxy that adds latency, stalls, black-holes,
  resets or half-closes the connections through it, switchable during a test.
* ``mariadb.PrivateMariaDB``: a private ``mariadbd`` (``--no-defaults``, temporary
  datadir, own port and socket) that a test may ``kill -9`` and start again.
* ``nodeproc.NodeProcess``: ``orbit`` as a separate process that can be SIGKILLed
  and restarted on the same address.
* ``clock``: the database clock seen from a later moment (``SET timestamp``), so a
  test can act "after a lease ran out" without waiting for it.
"""
