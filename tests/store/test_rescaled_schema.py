"""A store a rescale wrote to opens with the old partition count and the new one, not others."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sparkstate.exceptions import SchemaMismatchError
from sparkstate.files.durable import DurableDir
from sparkstate.store.conf import StoreConf, StoreId
from sparkstate.store.memory import MemoryStateStoreProvider
from sparkstate.store.schema_file import (
    merged_schema_record,
    partition_counts,
    read_schema_record,
    write_rescaled_schema,
)

KEY = pa.schema([("k", pa.string())])
VALUE = pa.schema([("n", pa.int64())])


def _open(root: Path, count: int) -> MemoryStateStoreProvider:
    provider = MemoryStateStoreProvider()
    provider.init(StoreId(str(root), 0, 0), KEY, VALUE, StoreConf(num_partitions=count))
    return provider


def test_both_counts_open_and_others_are_refused(tmp_path: Path) -> None:
    provider = _open(tmp_path, 4)
    store = provider.get_store(0)
    store.put(("a",), (1,))
    store.commit()
    provider.close()
    directory = DurableDir(str(tmp_path)).child(StoreId(str(tmp_path), 0, 0).relative_dir)
    record = read_schema_record(directory)
    assert record is not None and partition_counts(record) == [4]
    write_rescaled_schema(directory, merged_schema_record([record]), [4], 8)
    after = read_schema_record(directory)
    assert after is not None and partition_counts(after) == [4, 8]
    for count in (4, 8):
        _open(tmp_path, count).close()
    with pytest.raises(SchemaMismatchError, match="sparkstate repartition"):
        _open(tmp_path, 5)
