"""DLedger: RocketMQ 4.5+'s Raft-replicated commit log (openmessaging/dledger 0.2.6, the
version RocketMQ 4.9.4 ships), rebuilt for pymq (issue #42).

- :mod:`.config`: DLedgerConfig's defaults and how RocketMQ 4.9.4 fills it from the broker's
  ``dLeger*`` keys; the peers string parsed and checked.
- :mod:`.store`: DLedger's on-disk layout (data files, index files, ``checkpoint``,
  ``currterm``), byte for byte, so that a Java DLedger store can be read and taken over.
- :mod:`.protocol`: the request and response codes and the JSON bodies peers exchange in
  RocketMQ remoting frames.
- :mod:`.raft`: the election and replication rules as a sans-IO state machine (time and
  randomness are given to it).

- :mod:`.server`: a member on Trio, serving its peers on its ``dLegerPeers`` port.

Wired into the broker by ``enableDLegerCommitLog=true``: pymq.store.dledger_commitlog keeps
the commit log in a member's store, and BrokerController acts on its role changes (the leader
registers as the master).  This package imports only ``common`` and ``remoting``.
"""
