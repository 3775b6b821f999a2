"""The capabilities readers ask a provider for: a version's changes, its files, a version from rows.

Each is checked against what a user of the store sees: the changes equal the writes the version
made, the files equal the store's directory, the recorded row count equals the keys in state, a
version written from rows reads back as those rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkstate.exceptions import ConfigurationError, MissingVersionError
from sparkstate.store.base import DEFAULT_CF, StateStoreProvider, StoreId
from sparkstate.store.capabilities import (
    DescribesFiles,
    ReadsChanges,
    WritesVersions,
    provider_over_files,
    shares_files,
)
from sparkstate.store.families import Row
from sparkstate.testing.factory import ProviderFactory, durable_files, read_all

PROVIDERS = ["memory", "rocksdb"]
VERSIONS = 4


def _writes(v: int) -> tuple[dict[Row, Row], list[Row]]:
    puts: dict[Row, Row] = {("k", i): (v * 10 + i, f"v{v}") for i in range(v, v + 5)}
    return puts, [("k", v - 1)] if v > 1 else []


@pytest.fixture(params=PROVIDERS)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProviderFactory]:
    """Versions 1..4 with a snapshot on the way (every second version)."""
    made = ProviderFactory(
        request.param,
        str(tmp_path / "root"),
        str(tmp_path / "local"),
        conf={"min_deltas_for_snapshot": 2},
    )
    writer = made.open()
    for v in range(1, VERSIONS + 1):
        store = writer.get_store(v - 1)
        puts, removes = _writes(v)
        store.put_many(list(puts), list(puts.values()))
        store.remove_many(removes)
        store.commit()
        writer.do_maintenance()
    made.close_all()
    yield made
    made.close_all()


def test_changes_of_a_version_are_its_writes(factory: ProviderFactory) -> None:
    provider = factory.open()
    changes = ReadsChanges.require(provider, "the test reads changes")
    codec_k = changes.families[DEFAULT_CF].key_codec
    codec_v = changes.families[DEFAULT_CF].value_codec
    for v in range(1, VERSIONS + 1):
        seen: dict[Row, Row | None] = {}
        for keys, values in changes.read_changes(v, None, DEFAULT_CF, chunk_rows=2):
            assert len(keys) <= 2
            for k, val in zip(keys, values, strict=True):
                seen[codec_k.decode(k)] = None if val is None else codec_v.decode(val)
        puts, removes = _writes(v)
        assert seen == {**puts, **dict.fromkeys(removes)}


def test_changes_of_a_version_retention_removed_are_missing(factory: ProviderFactory) -> None:
    provider = factory.open()
    with pytest.raises(MissingVersionError):
        ReadsChanges.require(provider, "test").read_changes(VERSIONS + 3, None)


def test_files_described_are_the_stores_directory(factory: ProviderFactory) -> None:
    provider = factory.open()
    stored = DescribesFiles.require(provider, "test").describe_files()
    names = durable_files(factory.store_id)
    assert stored.versions == sorted({v for v, _, _ in names})
    root = Path(factory.checkpoint_root, factory.store_id.relative_dir)
    delta = "delta" if factory.provider_cls.name == "memory" else "changelog"
    for group, ext in ((stored.changelogs, delta), (stored.snapshots, "snapshot")):
        mine = [n for _, _, n in names if n.endswith(f".{ext}")]
        assert group.files == len(mine) > 0
        assert group.bytes == sum(os.path.getsize(root / n) for n in mine)
    sst = list((root / "sst").iterdir()) if (root / "sst").exists() else []
    assert (stored.shared.files, stored.shared.bytes) == (
        len(sst),
        sum(p.stat().st_size for p in sst),
    )
    assert (stored.shared.files > 0) == shares_files(factory.provider_cls.name)


def test_recorded_rows_are_the_keys_in_state(factory: ProviderFactory) -> None:
    provider = factory.open()
    files = DescribesFiles.require(provider, "test")
    for v in range(1, VERSIONS + 1):
        recorded = files.recorded_rows(v, None)
        if recorded is not None:  # a provider may record none: then readers load the state
            assert recorded == len(read_all(provider.get_read_store(v))[DEFAULT_CF])
    if factory.provider_cls.name == "rocksdb":  # its changelogs record the count it reports
        assert files.recorded_rows(VERSIONS, None) is not None


def test_a_version_written_from_rows_reads_back_as_them(factory: ProviderFactory) -> None:
    source = factory.open()
    state = read_all(source.get_read_store(VERSIONS))[DEFAULT_CF]
    store = source.get_read_store(VERSIONS)
    family = store.column_family(DEFAULT_CF)
    pairs = list(store.raw_scan(family.prefix, family.end_of_family()))
    store.abort()
    factory.close_all()
    target = StoreId(factory.checkpoint_root, 0, 1)
    writer = factory.open(store_id=target)  # writes the new store's _schema.json
    checkpoint_id = WritesVersions.require(writer, "test").write_version(
        7, [k for k, _ in pairs], [v for _, v in pairs]
    )
    factory.close_all()
    with provider_over_files(factory.provider_cls.name, target) as bound:
        assert bound is not None
        assert read_all(bound.get_read_store(7, checkpoint_id))[DEFAULT_CF] == state
        files = DescribesFiles.require(bound, "test")
        assert files.describe_files().versions == [7]
        assert files.recorded_rows(7, checkpoint_id) in (None, len(state))


def test_a_provider_without_a_capability_is_refused_by_name() -> None:
    class Plain(StateStoreProvider):  # the contract alone, none of the capabilities
        name = "plain"
        init = get_store = get_read_store = latest_version = None  # type: ignore[assignment]
        last_checkpoint_id = do_maintenance = close = None  # type: ignore[assignment]

    plain = Plain()
    assert ReadsChanges.of(plain) is None
    with pytest.raises(ConfigurationError, match="'plain' cannot write a version from rows"):
        WritesVersions.require(plain, "a rescale")


def test_a_store_that_never_ran_has_no_provider_over_its_files(tmp_path: Path) -> None:
    with provider_over_files("rocksdb", StoreId(str(tmp_path), 0, 0)) as bound:
        assert bound is None
