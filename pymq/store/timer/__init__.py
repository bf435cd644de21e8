"""Timer messages (RocketMQ 5's timer message store): a time wheel over an append-only timer log.

``log.py`` holds the timer log, ``wheel.py`` the fixed-size slot file whose slots chain log
entries, ``checkpoint.py`` the progress that recovery starts from.  The service that fills and
drains them is ``pymq/broker/timer.py``.
"""
