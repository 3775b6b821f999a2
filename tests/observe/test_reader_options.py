"""The state reader's options, as Spark's ``statestore`` source spells them, and what a wrong
one is told (no Spark needed)."""

from __future__ import annotations

import pytest

from sparkstate.exceptions import ConfigurationError
from sparkstate.observe.reader import ReadRequest


def test_spark_option_names_in_any_case() -> None:
    request = ReadRequest.from_options(
        {
            "path": "/chk",
            "BATCHID": "4",
            "operatorId": "1",
            "stateVarName": "count",
            "flattenCollectionTypes": "False",
        }
    )
    assert request == ReadRequest(
        "/chk", batch_id=4, operator_id=1, store_name="count", flatten=False
    )
    feed = ReadRequest.from_options(
        {"readChangeFeed": "true", "changeStartBatchId": "2", "changeEndBatchId": "5"}, "/chk"
    )
    assert (feed.change_feed, feed.change_start, feed.change_end) == (True, 2, 5)
    side = ReadRequest.from_options({"joinSide": "Right", "storeName": "x"}, "/chk")
    assert (side.join_side, side.store_name) == ("right", "x")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give the checkpoint location"),
        ({"path": "/c", "batch": "1"}, "unknown option 'batch'"),
        ({"path": "/c", "batchId": "x"}, "batchId='x' is not an integer"),
        ({"path": "/c", "batchId": "-1"}, "batchId must be >= 0"),
        ({"path": "/c", "joinSide": "both"}, "joinSide must be 'left' or 'right'"),
        ({"path": "/c", "readChangeFeed": "yes"}, "must be true or false"),
        ({"path": "/c", "readChangeFeed": "true"}, "needs changeStartBatchId"),
        ({"path": "/c", "snapshotPartitionId": "0"}, "go together"),
        (
            {"path": "/c", "snapshotPartitionId": "0", "snapshotStartBatchId": "3", "batchId": "2"},
            "snapshotStartBatchId 3 is after batchId 2",
        ),
        (
            {"path": "/c", "readChangeFeed": "true", "changeStartBatchId": "1", "batchId": "2"},
            "batchId does not go with readChangeFeed",
        ),
        (
            {
                "path": "/c",
                "readChangeFeed": "true",
                "changeStartBatchId": "3",
                "changeEndBatchId": "2",
            },
            "changeEndBatchId 2 is before changeStartBatchId 3",
        ),
        ({"path": "/c", "changeStartBatchId": "1"}, "need readChangeFeed=true"),
    ],
)
def test_wrong_options_say_what_is_wrong(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ReadRequest.from_options(options)
