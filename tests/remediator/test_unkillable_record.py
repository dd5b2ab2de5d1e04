"""An `unkillable` event's detail carries its processes after `processes: ` (the journal
has no column for them): one typed record writes that text and reads it back, the same
text byte for byte as the events already in journals."""

from __future__ import annotations

import json

import pytest

from mlx_medic.remediator.run_survivors import UNKILLABLE_DATA, UnkillableRecord

ADVICE = "reboot ai002 (it serves m1)"


def test_the_detail_is_the_sentence_then_the_processes_as_json() -> None:
    record = UnkillableRecord.of("ai002", [(77, 1700000000.25), (78, 1700000001.0)])
    data = json.dumps({"node": "ai002", "processes": [[77, 1700000000.25], [78, 1700000001.0]]})
    assert record.to_detail(ADVICE) == (
        f"2 process(es) on ai002 survive SIGKILL (pids 77, 78); {ADVICE}. {UNKILLABLE_DATA}{data}"
    )


def test_a_detail_reads_back_as_its_record_and_identities() -> None:
    record = UnkillableRecord.of("ai002", [(77, 1700000000.25)])
    assert UnkillableRecord.parse(record.to_detail(ADVICE)) == record
    assert record.identities == {("ai002", 77, 1700000000.25)}


@pytest.mark.parametrize(
    "detail",
    [
        "3 process(es) on ai002 survive SIGKILL",  # no data
        f"x. {UNKILLABLE_DATA}not json",
        f'x. {UNKILLABLE_DATA}{{"node": "ai002"}}',
        f'x. {UNKILLABLE_DATA}{{"node": "ai002", "processes": [["p", 1]]}}',
    ],
)
def test_a_detail_without_its_processes_is_a_value_error(detail: str) -> None:
    with pytest.raises(ValueError, match="no unkillable processes"):
        UnkillableRecord.parse(detail)
