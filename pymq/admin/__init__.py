"""Administration: the websocket admin channel, the browser console and the mqadmin-style CLI.

The operations themselves live with the broker, in :mod:`pymq.broker.admin_service` (shared by
the channel and by the broker's remoting admin processor, which the CLI talks to); this package
builds on the broker and the broker never imports it.

- :mod:`pymq.admin.protocol`: the channel's JSON messages, sans-IO.
- :mod:`pymq.admin.channel`: the Trio websocket + static-file server (a broker nursery task).
- :mod:`pymq.admin.cli`: ``python -m pymq.admin`` / ``pymq-admin``.
"""
