"""pymq: Apache RocketMQ's name server and broker in Python on Trio."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pymq")
except PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "unknown"
