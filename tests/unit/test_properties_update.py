"""Saving runtime config changes into a properties file: the changed keys' values replaced,
everything else (comments, other keys, continued lines) kept as the operator wrote it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pymq.common.files import save_properties
from pymq.common.properties import escape_value, parse_properties, updated_properties_text

CONF = """\
# broker-a, edited by hand
brokerClusterName = DefaultCluster
brokerName=broker-a
! a Java-style comment
deleteWhen: 04
messageDelayLevel=1s 5s \\
    10s 30s
brokerName=broker-a-again
"""


def test_changed_keys_are_replaced_wherever_they_stand_and_the_rest_is_kept() -> None:
    text = updated_properties_text(CONF, {"brokerName": "b", "messageDelayLevel": "1s 2s"})
    assert parse_properties(text) == {
        **parse_properties(CONF),
        "brokerName": "b",
        "messageDelayLevel": "1s 2s",
    }
    assert "# broker-a, edited by hand\n" in text
    assert "! a Java-style comment\n" in text
    assert "deleteWhen: 04\n" in text
    assert "10s 30s" not in text  # the continued line went with its key
    assert text.count("brokerName") == 1  # both old lines of the key are gone
    assert text.endswith("brokerName=b\nmessageDelayLevel=1s 2s\n")


def test_a_new_key_is_appended_to_an_empty_file() -> None:
    assert updated_properties_text("", {"deleteWhen": "03"}) == "deleteWhen=03\n"


# Text a config value can be: any character but a lone surrogate (not UTF-8).
values = st.text(st.characters(exclude_categories=("Cs",)))


@given(values)
def test_every_value_reads_back_as_it_was_written(value: str) -> None:
    text = updated_properties_text(CONF, {"msgTraceTopicName": value})
    assert parse_properties(text)["msgTraceTopicName"] == value
    assert parse_properties(f"k={escape_value(value)}") == {"k": value}


def test_save_properties_makes_the_file_and_keeps_the_old_one_as_bak(tmp_path) -> None:
    path = tmp_path / "config" / "broker.properties"
    save_properties(str(path), {"deleteWhen": "03"})
    assert path.read_text() == "deleteWhen=03\n"
    save_properties(str(path), {"fileReservedTime": "48"})
    assert parse_properties(path.read_text()) == {"deleteWhen": "03", "fileReservedTime": "48"}
    assert (tmp_path / "config" / "broker.properties.bak").read_text() == "deleteWhen=03\n"
