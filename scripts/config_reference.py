"""Write docs/reference/configuration.md from the config classes and config-keys.toml beside it.

Every key of the name server's and the broker's config classes (read from the attrs classes
themselves: key, type, pymq's default) must have an entry in ``config-keys.toml`` saying what it
does in pymq; the run fails, naming them, when a key has none or an entry names no key.

    python scripts/config_reference.py            # write the page
    python scripts/config_reference.py --check    # exit 1 if the page is not what it would write

An entry (``[section.key]``) has:

- ``effect``: what the key does in pymq (required);
- ``status``: ``"effect"`` (the default), ``"none"`` (accepted so that RocketMQ's files load,
  with no effect in pymq: ``effect`` says why) or ``"refused"`` (a value other than the default
  stops the start: ``effect`` says why);
- ``rocketmq``: RocketMQ 4.9.4's default, where it differs from pymq's; ``"pymq"`` for a key of
  pymq's own;
- ``default``: the default as text, required where the default depends on the machine (a host
  name, an environment variable, the user's home), so that the page is the same everywhere.
"""

from __future__ import annotations

import argparse
import enum
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs

from pymq.broker.admin_service import RESTART_ONLY_KEYS as BROKER_RESTART_ONLY
from pymq.broker.config import BROKER_DEFAULT_PORT, BrokerConfig
from pymq.common.serde import java_name
from pymq.namesrv.config import NAMESRV_DEFAULT_PORT, NamesrvConfig
from pymq.namesrv.processor import RESTART_ONLY_KEYS as NAMESRV_RESTART_ONLY
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "reference" / "config-keys.toml"
PAGE = ROOT / "docs" / "reference" / "configuration.md"
STATUSES = ("effect", "none", "refused")


@dataclass(frozen=True)
class Section:
    name: str  # the TOML table
    title: str
    intro: str
    config: object  # a default instance of the class
    restart_only: frozenset[str]


def sections() -> list[Section]:
    return [
        Section(
            "namesrv",
            "Name server: NamesrvConfig",
            "Keys of `python -m pymq.namesrv` (its properties file, `-c`, or `--key value`).",
            NamesrvConfig(),
            NAMESRV_RESTART_ONLY,
        ),
        Section(
            "server",
            "Both servers' ports: NettyServerConfig",
            "Keys of the name server's and the broker's listening ports and connection limits, in "
            f"either's file. `listenPort` defaults to {NAMESRV_DEFAULT_PORT} for the name server "
            f"and {BROKER_DEFAULT_PORT} for the broker.",
            NettyServerConfig(listen_port=BROKER_DEFAULT_PORT),
            NAMESRV_RESTART_ONLY | BROKER_RESTART_ONLY,
        ),
        Section(
            "broker",
            "Broker: BrokerConfig",
            "Keys of `python -m pymq.broker` (`broker.conf`), and of `python -m pymq` with "
            "`--key value`.",
            BrokerConfig(),
            BROKER_RESTART_ONLY,
        ),
        Section(
            "store",
            "Broker's store: MessageStoreConfig",
            "Keys of the broker's message store, in `broker.conf`.",
            MessageStoreConfig(),
            BROKER_RESTART_ONLY,
        ),
        Section(
            "client",
            "Broker's own connections: NettyClientConfig",
            "Keys of the connections the broker opens (to name servers, a slave's to its master).",
            NettyClientConfig(),
            BROKER_RESTART_ONLY,
        ),
    ]


def _type_text(kind: Any) -> str:
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return " \\| ".join(str(m.value) for m in kind)
    text = getattr(kind, "__name__", None) or str(kind)
    return {"str | None": "str", "NoneType": "str"}.get(text, text).replace("|", "\\|")


def _value_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None or value == "":
        return "(empty)"
    return str(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def build(data: dict[str, dict[str, dict[str, str]]]) -> tuple[str, list[str]]:
    """The page, and the problems (keys without entries, entries without keys, bad entries)."""
    problems: list[str] = []
    out = [
        "# Configuration keys",
        "",
        "<!-- Written by scripts/config_reference.py from the config classes and",
        "     config-keys.toml beside this page: edit those, then run the script. -->",
        "",
        "Every key pymq reads, by the config class that holds it, with RocketMQ's key names. "
        "Keys go in the server's properties file (`-c FILE`) or on the command line "
        "(`--key value`); `-p` prints the effective configuration. A key that no class knows "
        "is reported at start, never dropped silently.",
        "",
        "- **Runtime**: *yes* if `UPDATE_BROKER_CONFIG` / `UPDATE_NAMESRV_CONFIG` (mqadmin "
        "`updateBrokerConfig`, `pymq-admin`, the console) may change it on a running server; "
        "*restart* if the server refuses and the change needs a restart. A change made at "
        "runtime is saved before it takes effect, into the file the server was started with "
        "(`-c`) or else its own (the broker's `broker.properties` in its store's `config/` "
        "directory, the name server's `configStorePath`), which it reads at its next start "
        "when started without `-c`: a restart keeps the change.",
        "- **RocketMQ**: RocketMQ 4.9.4's default where it differs from pymq's; *pymq* marks "
        "a key of pymq's own.",
        "- Keys marked **no effect** are accepted so that RocketMQ's files load unchanged, and "
        "do nothing in pymq; keys marked **refused** stop the start unless left at their "
        "default.",
        "",
    ]
    seen: set[tuple[str, str]] = set()
    for section in sections():
        entries = data.get(section.name, {})
        cls: Any = type(section.config)
        attrs.resolve_types(cls)
        out += [f"## {section.title}", "", section.intro, ""]
        out += [
            "| key | type | default | RocketMQ | runtime | effect |",
            "|---|---|---|---|---|---|",
        ]
        for field in attrs.fields(cls):
            key = java_name(field)
            seen.add((section.name, key))
            entry = entries.get(key)
            if entry is None:
                problems.append(f"{section.name}.{key}: no entry in {DATA.name}")
                continue
            status = entry.get("status", "effect")
            if status not in STATUSES or not entry.get("effect"):
                problems.append(f"{section.name}.{key}: needs an effect and a status of {STATUSES}")
                continue
            dynamic = isinstance(field.default, attrs.Factory)  # type: ignore[arg-type]
            if dynamic and "default" not in entry:
                problems.append(
                    f"{section.name}.{key}: its default depends on the machine: give it"
                )
                continue
            # A machine's default is described in words; a fixed one is shown as a value.
            default = (
                entry.get("default") or f"`{_value_text(getattr(section.config, field.name))}`"
            )
            effect = entry["effect"]
            if status == "none":
                effect = f"**No effect.** {effect}"
            elif status == "refused":
                effect = f"**Refused.** {effect}"
            runtime = "restart" if key in section.restart_only else "yes"
            row = [
                f"`{key}`",
                _type_text(field.type),
                f"`{default}`",
                entry.get("rocketmq", ""),
                runtime,
                effect,
            ]
            out.append("| " + " | ".join(_cell(c) for c in row) + " |")
        out.append("")
    for name, entries in data.items():
        for key in entries:
            if (name, key) not in seen:
                problems.append(f"{name}.{key}: an entry for a key no config class has")
    return "\n".join(out), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    args = parser.parse_args(argv)
    with open(DATA, "rb") as f:
        data = tomllib.load(f)
    page, problems = build(data)
    for problem in problems:
        print(f"config reference: {problem}", file=sys.stderr)
    if problems:
        return 1
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"config reference: {PAGE} is out of date: run {__file__}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
