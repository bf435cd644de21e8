"""Master/slave commit-log replication (RocketMQ 4.x HA): framing, master service, slave client."""
