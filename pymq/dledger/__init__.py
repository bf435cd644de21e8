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

Not wired into the broker yet: ``enableDLegerCommitLog=true`` is refused at start
(pymq.broker.config.UNSUPPORTED_KEYS).  This package imports only ``common`` and ``remoting``,
so that the store can import it when it is wired.
"""
