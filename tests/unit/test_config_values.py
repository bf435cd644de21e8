"""Config values a config body cannot carry, or that fail their key's type, are refused where
they come in: at startup (config file, flags), UPDATE_BROKER_CONFIG, UPDATE_NAMESRV_CONFIG and
the admin channel, all through one conversion (issue #37, item 11).  Before, a lone surrogate
set at runtime (``msgTraceTopicName=\\uD800``) made every GET_BROKER_CONFIG fail."""

from __future__ import annotations

import pathlib

import attrs
import pytest

from pymq.broker.config import BrokerConfig
from pymq.common.cli import load_configs
from pymq.common.config import (
    JAVA_INT_KEYS,
    SHOWN_VALUE_CHARS,
    ConfigError,
    set_key,
    to_properties,
    unwritable,
    update_at_runtime,
)
from pymq.common.properties import format_properties, parse_properties
from pymq.common.serde import java_name
from pymq.namesrv.config import NamesrvConfig
from pymq.remoting.config import ConnectionLimits, NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig

# As a properties body writes them (the escapes decoded by the parser), and why each is refused.
UNWRITABLE = [
    ("\\uD800", "lone surrogate"),
    ("topic\\uDFFFx", "lone surrogate"),
    ("a\\u0000b", "U+0000"),
    ("a\\nb", "U+000A"),
    ("a\\rb", "U+000D"),
    ("a\\fb", "U+000C"),
    ("x\\u001b[31m", "U+001B"),
    ("x\\u007f", "U+007F"),
    ("x\\u0085y", "U+0085"),
    ("x\\u2028y", "U+2028"),
    ("x\\u2029y", "U+2029"),
]


@pytest.mark.parametrize(("escaped", "why"), UNWRITABLE)
def test_text_a_config_body_cannot_carry_is_refused_with_no_change(escaped: str, why: str) -> None:
    configs = [BrokerConfig(), MessageStoreConfig()]
    before = to_properties(configs)
    body = f"brokerPermission=4\nmsgTraceTopicName={escaped}\n"
    with pytest.raises(ConfigError) as info:
        update_at_runtime(configs, parse_properties(body), frozenset(), "broker")
    message = str(info.value)
    assert "msgTraceTopicName" in message and why in message
    message.encode("utf-8")  # the remark itself is sendable
    assert "\n" not in message
    assert to_properties(configs) == before  # the good key of the same body was not applied
    format_properties(to_properties(configs)).encode("utf-8")  # GET_*_CONFIG still answers


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("brokerPermission", "1_000", "not an integer"),
        ("brokerPermission", "6.0", "not an integer"),
        ("brokerPermission", "", "not an integer"),
        ("brokerPermission", str(2**31), "outside a Java int"),
        ("maxDelayTime", str(-(2**31) - 1), "outside a Java int"),
        ("consumerFallbehindThreshold", str(2**63), "outside a Java long"),
        ("consumerFallbehindThreshold", str(-(2**63) - 1), "outside a Java long"),
        ("consumerFallbehindThreshold", "9" * 5000, "outside a Java long"),
        ("brokerRole", "LEADER", "one of ASYNC_MASTER, SYNC_MASTER, SLAVE"),
        ("slaveReadEnable", "true\\u0000", "U+0000"),
    ],
)
def test_values_that_fail_the_type_are_refused(key: str, value: str, why: str) -> None:
    configs = [BrokerConfig(), MessageStoreConfig()]
    before = to_properties(configs)
    with pytest.raises(ConfigError) as info:
        update_at_runtime(configs, parse_properties(f"{key}={value}\n"), frozenset(), "broker")
    assert key in str(info.value) and why in str(info.value)
    assert to_properties(configs) == before


def test_java_integer_forms_and_bounds_are_accepted() -> None:
    config = BrokerConfig()
    for text, expected in (
        ("+5", 5),
        (" 7 ", 7),
        ("-1", -1),
        (str(2**63 - 1), 2**63 - 1),
        ("0" * 30 + "12", 12),
    ):
        set_key(config, "consumerFallbehindThreshold", text)
        assert config.consumer_fallbehind_threshold == expected
    set_key(config, "maxDelayTime", str(2**31 - 1))
    assert config.max_delay_time == 2**31 - 1


def test_every_java_int_key_is_an_integer_key_here() -> None:
    configs = [BrokerConfig(), MessageStoreConfig(), NettyServerConfig(), NettyClientConfig()]
    configs.append(NamesrvConfig())
    integer_keys = set()
    for config in configs:
        for field in attrs.fields(type(config)):
            if field.type in (int, "int"):
                integer_keys.add(java_name(field))
    assert not JAVA_INT_KEYS - integer_keys


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_float_key_must_be_finite(value: str) -> None:
    limits = ConnectionLimits()
    key = next(java_name(f) for f in attrs.fields(ConnectionLimits) if f.type in (float, "float"))
    with pytest.raises(ConfigError, match="not a finite number"):
        set_key(limits, key, value)


def test_error_quotes_a_long_value_bounded() -> None:
    with pytest.raises(ConfigError) as info:
        set_key(BrokerConfig(), "msgTraceTopicName", "x" * 100_000 + "\n")
    assert len(str(info.value)) < SHOWN_VALUE_CHARS + 200


def test_an_unknown_key_that_cannot_be_written_is_quoted_safely() -> None:
    with pytest.raises(ConfigError) as info:
        update_at_runtime([BrokerConfig()], {"\ud800\n": "1"}, frozenset(), "broker")
    str(info.value).encode("utf-8")
    assert "\n" not in str(info.value)


def test_every_writable_text_comes_back_from_the_config_body() -> None:
    """Backslashes, tabs, '=', ':', '#' and any other Unicode: what GET_BROKER_CONFIG writes
    reads back as the value that was set (a bare backslash would be read as an escape)."""
    config = BrokerConfig()
    texts = ["C:\\store\\new", "a\tb", "k=v:w", "#not a comment", "中文 é ü", "\\u0041", "\\"]
    for text in texts:
        assert unwritable(text) is None
        update_at_runtime([config], {"msgTraceTopicName": text}, frozenset(), "broker")
        body = format_properties(to_properties([config])).encode("utf-8")
        assert parse_properties(body.decode("utf-8"))["msgTraceTopicName"] == text


def test_a_config_file_with_such_a_value_is_refused_at_start(tmp_path: pathlib.Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-a\nmsgTraceTopicName=\\uD800\n")
    config = BrokerConfig()
    with pytest.raises(ConfigError) as info:
        load_configs([config], str(conf), {})
    message = str(info.value)
    assert message.startswith(f"{conf}: bad value for msgTraceTopicName")
    assert "lone surrogate" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"^bad value for brokerName: .*U\+000A"):
        load_configs([BrokerConfig()], None, {"brokerName": "a\nb"})  # a --key flag
