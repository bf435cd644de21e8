"""Administration: the websocket admin channel, the browser console and the mqadmin-style CLI.

- :mod:`pymq.admin.service`: the operations themselves, on a running broker (shared by the
  channel and by the broker's remoting admin processor, which the CLI talks to).
- :mod:`pymq.admin.protocol`: the channel's JSON messages, sans-IO.
- :mod:`pymq.admin.channel`: the Trio websocket + static-file server (a broker nursery task).
- :mod:`pymq.admin.cli`: ``python -m pymq.admin`` / ``pymq-admin``.
"""
