"""Alertmanager's webhook payload: what is accepted, what is refused whole and why, and
which alerts inside a payload are invalid on their own (and why), beside the good ones."""

from __future__ import annotations

import json

import pytest

from mlx_medic.remediator.alerts import AlertEvent, AlertStatus, InvalidAlert
from mlx_medic.remediator.config import RoutingConfig
from mlx_medic.remediator.payload import (
    PayloadError,
    UnsupportedContentType,
    check_content_type,
    parse_payload,
    to_events,
)
from tests.remediator.conftest import make_alert, make_payload


def encode(value: object) -> bytes:
    return json.dumps(value).encode()


def only_invalid(raw: dict[str, object], routing: RoutingConfig | None = None) -> InvalidAlert:
    """The payload's one alert, which must come out invalid."""
    (result,) = to_events(parse_payload(encode(raw)), routing)
    assert isinstance(result, InvalidAlert), result
    return result


def test_a_real_shaped_payload_becomes_one_event_per_alert() -> None:
    payload = parse_payload(
        encode(
            make_payload(
                make_alert("m1", fingerprint="aa"),
                make_alert("m2", fingerprint="bb", status="resolved"),
            )
        )
    )
    events = to_events(payload)
    assert [(e.fingerprint, e.status, e.labels["model"]) for e in events] == [
        ("aa", AlertStatus.FIRING, "m1"),
        ("bb", AlertStatus.RESOLVED, "m2"),
    ]
    assert events[0].alertname == "LLMModelDown"
    assert events[0].receiver == "mlx-medic"
    assert events[0].starts_at.tzinfo is not None


def test_fields_a_newer_alertmanager_adds_are_tolerated() -> None:
    raw = make_payload(make_alert(), notification_reason="new", routeLabels={"a": "b"})
    raw["alerts"][0]["someFutureField"] = {"x": 1}
    assert len(to_events(parse_payload(encode(raw)))) == 1


def test_the_zero_time_alertmanager_sends_as_endsat_is_accepted() -> None:
    alert = make_alert()
    alert["endsAt"] = "0001-01-01T00:00:00Z"
    (event,) = to_events(parse_payload(encode(make_payload(alert))))
    assert isinstance(event, AlertEvent)


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"{not json", "body is not valid JSON"),
        (b"\xff\xfe", "body is not UTF-8"),
        (b"[]", "payload must be a JSON object, got array"),
        (b'"4"', "payload must be a JSON object, got string"),
        (b"null", "payload must be a JSON object, got null"),
        (b"4", "payload must be a JSON object, got number"),
        (encode({"groupKey": "x"}), "version: required field is missing"),
        (encode(make_payload(version="3")), 'unsupported payload version "3"'),
        (encode(make_payload(version=4)), "unsupported payload version 4"),
    ],
)
def test_unusable_bodies_are_refused_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason.replace("(", r"\(")):
        parse_payload(body)


@pytest.mark.parametrize("body", [b"", b" ", b"\n", b" \r\n\t "])
def test_an_empty_or_blank_body_is_refused_as_empty_saying_what_is_expected(body: bytes) -> None:
    """Not JSON's "Expecting value at line 1 column 1": the sender learns what is missing."""
    with pytest.raises(PayloadError) as refused:
        parse_payload(body)
    assert str(refused.value) == (
        'body is empty: expected an Alertmanager webhook JSON payload (version "4")'
    )
    assert refused.value.http_status == 400


@pytest.mark.parametrize("field", ["groupKey", "status", "receiver", "alerts"])
def test_a_missing_top_level_field_is_named(field: str) -> None:
    raw = make_payload()
    del raw[field]
    with pytest.raises(PayloadError, match=f"{field}: required field is missing"):
        parse_payload(encode(raw))


@pytest.mark.parametrize("field", ["status", "labels", "startsAt", "fingerprint"])
def test_a_missing_alert_field_makes_that_alert_invalid_naming_its_place(field: str) -> None:
    raw = make_payload()
    del raw["alerts"][0][field]
    assert only_invalid(raw).reason == f"alerts[0].{field}: required field is missing"


@pytest.mark.parametrize(
    "labels", [{"model": 1}, {"model": None}, {"model": ["m1"]}, {"model": {"x": "y"}}]
)
def test_label_values_must_be_strings(labels: dict[str, object]) -> None:
    raw = make_payload()
    raw["alerts"][0]["labels"].update(labels)
    assert only_invalid(raw).reason.startswith("alerts[0].labels.model:")


def test_a_start_time_without_a_timezone_makes_the_alert_invalid() -> None:
    raw = make_payload()
    raw["alerts"][0]["startsAt"] = "2026-11-30T01:02:03"
    assert "alerts[0].startsAt" in only_invalid(raw).reason


def test_an_unknown_alert_status_makes_the_alert_invalid() -> None:
    raw = make_payload()
    raw["alerts"][0]["status"] = "pending"
    invalid = only_invalid(raw)
    assert invalid.reason.startswith("alerts[0].status:") and invalid.status == "pending"


def test_a_routed_alert_without_the_model_label_is_invalid_saying_so() -> None:
    invalid = only_invalid(make_payload(make_alert(None, fingerprint="f1")))
    assert invalid.reason == (
        "alerts[0].labels.model: alert \"LLMModelDown\" needs the 'model' label naming the model"
    )
    assert (invalid.index, invalid.alertname, invalid.fingerprint, invalid.model) == (
        0,
        "LLMModelDown",
        "f1",
        "",
    )


def test_the_model_label_name_comes_from_the_routing_config() -> None:
    routing = RoutingConfig(playbooks={"LLMModelDown": "recover"}, model_label="llm")
    payload = parse_payload(encode(make_payload(make_alert(None, labels={"llm": "m1"}))))
    (event,) = to_events(payload, routing)
    assert isinstance(event, AlertEvent) and event.labels["llm"] == "m1"
    assert "labels.llm" in only_invalid(make_payload(make_alert("m1")), routing).reason


def test_an_unrouted_alert_does_not_need_a_model_label() -> None:
    payload = parse_payload(encode(make_payload(make_alert(None, alertname="DiskFull"))))
    assert to_events(payload)[0].alertname == "DiskFull"


def test_an_alert_without_an_alertname_is_invalid() -> None:
    raw = make_payload()
    del raw["alerts"][0]["labels"]["alertname"]
    assert only_invalid(raw).reason == "alerts[0].labels.alertname: required label is missing"


def test_one_bad_alert_leaves_the_good_ones_beside_it_in_their_order() -> None:
    raw = make_payload(
        make_alert("m1", fingerprint="a"),
        make_alert(None, fingerprint="b"),
        make_alert("m2", fingerprint="c"),
    )
    raw["alerts"].append(["not", "an", "alert"])
    results = to_events(parse_payload(encode(raw)))
    assert [type(r).__name__ for r in results] == [
        "AlertEvent",
        "InvalidAlert",
        "AlertEvent",
        "InvalidAlert",
    ]
    assert [r.fingerprint for r in results] == ["a", "b", "c", ""]
    last = results[3]
    assert isinstance(last, InvalidAlert) and last.index == 3
    assert last.reason.startswith("alerts[3]: Input should be a valid dictionary")


def test_what_is_kept_of_an_invalid_alert_is_bounded_text() -> None:
    raw = make_payload(make_alert("m" * 5000, fingerprint="f" * 5000))
    raw["alerts"][0]["status"] = 7
    invalid = only_invalid(raw)
    assert len(invalid.model) == len(invalid.fingerprint) == 200 and invalid.status == ""


def test_hostile_label_values_stay_exact_data() -> None:
    hostile = "; $(touch /tmp/CANARY) `id` ../../etc\n\x00"
    payload = parse_payload(encode(make_payload(make_alert(hostile))))
    (event,) = to_events(payload)
    assert isinstance(event, AlertEvent) and event.labels["model"] == hostile


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON"])
def test_json_content_types_pass(content_type: str) -> None:
    check_content_type(content_type)


@pytest.mark.parametrize(
    "content_type, reason",
    [
        ("text/plain", "content type must be application/json, got text/plain"),
        (  # what `curl -d` sends unless told otherwise
            "application/x-www-form-urlencoded",
            "content type must be application/json, got application/x-www-form-urlencoded",
        ),
        ("", "content type must be application/json, got none (no Content-Type header)"),
    ],
)
def test_other_content_types_are_unsupported_media_types_naming_both_types(
    content_type: str, reason: str
) -> None:
    with pytest.raises(UnsupportedContentType) as refused:
        check_content_type(content_type)
    assert str(refused.value) == reason
    assert refused.value.http_status == 415
