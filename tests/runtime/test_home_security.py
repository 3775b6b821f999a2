"""Only the application gets into a state home: real home processes (``home_processes.py``)
with ``spark.authenticate`` on and off, encryption seen on the wire through a recording proxy,
the wire fuzzed, and the modes of the homes' and the local copies' files."""

from __future__ import annotations

import os
import pickle
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest
from tests.runtime.home_processes import (
    SECRET,
    RecordingProxy,
    fuzz,
    run_job,
    running_home,
)

from sparkstate.exceptions import ConfigurationError, StateFileError
from sparkstate.files.private import PrivateDirError, private_dir, write_private
from sparkstate.runtime import home_client, home_secret
from sparkstate.runtime.home_channel import NO_CREDENTIALS, Channel, Credentials, _Seal
from sparkstate.runtime.home_reads import READ
from sparkstate.runtime.home_wire import MAX_FRAME
from sparkstate.runtime.process_ref import ProcessRef
from sparkstate.store.local_dir import LocalStoreDir

GOOD = Credentials(SECRET.encode(), encrypt=True)


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_without_the_secret_a_home_refuses_and_serves_on() -> None:
    with running_home(auth=True, encrypt=True) as home:
        assert run_job(home_client.connect_owner(home.address, GOOD), ["a", "b"])[1] == {
            "a": 1,
            "b": 1,
        }
        other_home = home.address.rpartition("/")[0] + "/" + "0" * 32
        refused = [
            ("the checkpoint's token alone", home.address, NO_CREDENTIALS),
            ("a wrong secret", home.address, Credentials(b"not-the-secret", encrypt=True)),
            ("the secret without encryption", home.address, Credentials(SECRET.encode())),
            ("another home's token", other_home, GOOD),
        ]
        for what, address, credentials in refused:
            assert home_client.connect_owner(address, credentials) is None, what
        silent = socket.create_connection(("127.0.0.1", home.port))  # says nothing
        silent.settimeout(10)
        started = time.monotonic()
        assert silent.recv(100) == b""  # closed by the home at its handshake time (1 s)
        assert time.monotonic() - started < 5
        silent.close()
        assert home.process.poll() is None
        assert run_job(home_client.connect_owner(home.address, GOOD), ["a"])[1] == {
            "a": 2,
            "b": 1,
        }
        assert "refused" in Path(home.log).read_text()


def test_with_auth_off_the_token_is_enough_and_a_secret_is_refused() -> None:
    with running_home(auth=False, encrypt=False) as home:
        channel = home_client.connect_owner(home.address, NO_CREDENTIALS)
        assert channel is not None and not channel.encrypted
        assert run_job(channel, ["a"])[1] == {"a": 1}
        assert home_client.connect_owner(home.address, GOOD) is None


@pytest.mark.parametrize("encrypt", [True, False])
def test_encryption_hides_the_state_on_the_wire(encrypt: bool) -> None:
    marker = "state-value-7d3e91"
    with running_home(auth=True, encrypt=encrypt) as home:
        proxy = RecordingProxy(("127.0.0.1", home.port))
        try:
            via_proxy = f"127.0.0.1:{proxy.port}/{home.token}"
            credentials = Credentials(SECRET.encode(), encrypt=encrypt)
            rows, state = run_job(home_client.connect_owner(via_proxy, credentials), [marker])
            assert state == {marker: 1} and rows == [{"k": marker, "n": 1}]
            time.sleep(0.2)  # the proxy's last bytes
        finally:
            proxy.close()
        assert len(proxy.recorded) > 100
        assert SECRET.encode() not in proxy.recorded  # never, encrypted or not
        assert (marker.encode() in proxy.recorded) is not encrypt


def test_the_fuzzed_wire_leaves_a_home_serving_and_its_state_whole() -> None:
    fuzz_and_compare(20_000)


@pytest.mark.slow
def test_the_fuzzed_wire_at_100k_frames() -> None:
    fuzz_and_compare(100_000)


def fuzz_and_compare(frames: int) -> None:
    def run(frames: int) -> list[object]:
        with running_home(auth=True, encrypt=True) as home:
            threads = home.threads()
            got = [run_job(home_client.connect_owner(home.address, GOOD), ["a", "b", "a"])]
            if frames:
                started = time.monotonic()
                cases = fuzz(home, GOOD, frames)
                took = time.monotonic() - started
                print(f"{frames} malformed frames in {took:.1f} s: {dict(cases)}")
                assert sum(cases.values()) == frames
                assert len(cases) >= 10, cases
            got.append(run_job(home_client.connect_owner(home.address, GOOD), ["b", "c"]))
            assert home.process.poll() is None
            time.sleep(0.5)
            assert home.threads() <= threads + 2  # no thread left behind by the fuzz
            return got

    assert run(frames) == run(0)


def test_a_worker_finds_the_secret_where_the_driver_left_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(home_secret.SECRET_ENV, raising=False)
    home_secret.install_secret(None)
    me = ProcessRef.of(os.getpid())
    assert me is not None
    homes = str(tmp_path / "homes")
    with pytest.raises(ConfigurationError, match=r"spark\.authenticate is on"):
        home_secret.credentials(True, True, homes, me)
    path = home_secret.share_secret(homes, me, SECRET)
    assert _mode(homes) == 0o700 and _mode(path) == 0o600
    found = home_secret.credentials(True, True, homes, me)
    assert found.secret == SECRET.encode() and found.encrypt
    assert SECRET not in repr(found)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(found)
    os.chmod(path, 0o644)  # not this user's alone: not used
    with pytest.raises(ConfigurationError, match="not this user's alone"):
        home_secret.credentials(True, True, homes, me)
    monkeypatch.setenv(home_secret.SECRET_ENV, "from-the-executor")  # a cluster's executor
    assert home_secret.credentials(True, False, homes, None).secret == b"from-the-executor"
    assert home_secret.credentials(False, False, homes, me) == NO_CREDENTIALS


def test_the_homes_files_are_their_users_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    homes = tempfile.mkdtemp(prefix="homes-")  # short, for the socket
    os.chmod(homes, 0o755)  # as an earlier version made it: narrowed
    monkeypatch.setattr(home_client, "home_dir", lambda: homes)
    me = ProcessRef.of(os.getpid())
    assert me is not None
    channel = home_client.connect(me, 0)
    try:
        assert run_job(channel, ["x"])[1] == {"x": 1}
        assert _mode(homes) == 0o700
        names = os.listdir(homes)
        for suffix in (".sock", ".addr", ".pid", ".lock"):
            (name,) = [n for n in names if n.endswith(suffix)]
            assert _mode(os.path.join(homes, name)) == 0o600, name
        logs = [n for n in names if n.endswith(".log")]
        assert all(_mode(os.path.join(homes, n)) == 0o600 for n in logs), logs
    finally:
        (pid_name,) = [n for n in os.listdir(homes) if n.endswith(".pid")]
        pid = int(Path(homes, pid_name).read_text())
        os.kill(pid, 15)


def test_a_directory_others_can_write_or_that_is_a_link_is_refused(tmp_path: Path) -> None:
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(PrivateDirError, match="can be written by other users"):
        private_dir(str(open_to_all))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(PrivateDirError, match="not a link"):
        private_dir(str(link))
    made = private_dir(str(tmp_path / "new" / "homes"))
    assert _mode(made) == 0o700
    write_private(os.path.join(made, "f"), "x")
    assert _mode(os.path.join(made, "f")) == 0o600
    if os.getuid() == 0:  # a directory another user owns
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PrivateDirError, match="belongs to user 65534"):
            private_dir(str(theirs))


def test_a_stores_local_directory_is_private(tmp_path: Path) -> None:
    root = tmp_path / "local"
    store = LocalStoreDir(str(root), "k")
    store.acquire(1.0)
    try:
        assert _mode(root) == 0o700 and _mode(store.path) == 0o700
    finally:
        store.release()
    kept = LocalStoreDir(str(root), "older")
    os.makedirs(kept.path, mode=0o755)
    os.chmod(kept.path, 0o755)
    kept.acquire(1.0)
    kept.release()
    assert _mode(kept.path) == 0o700


def test_a_store_refuses_the_default_root_if_others_can_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "default"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("SPARKSTATE_LOCAL_DIR", str(root))
    with pytest.raises(StateFileError, match="can be written by other users"):
        LocalStoreDir(str(root), "k").acquire(1.0)


@pytest.mark.parametrize("sealed", [False, True])
def test_frames_sent_together_arrive_whole_and_in_order(sealed: bool) -> None:
    """A reader's requests to a home go in one send (``send_many``): each arrives as its own
    frame, in order, sealed or not; a frame too long for the home is refused before anything
    is sent."""
    left, right = socket.socketpair()
    one, two = os.urandom(32), os.urandom(32)
    a = Channel(left, _Seal(one, two) if sealed else None)
    b = Channel(right, _Seal(two, one) if sealed else None)
    with a, b:
        a.send_many([(READ, b"first"), (READ, b""), (READ, b"x" * 100_000)])
        a.send(READ, b"after")
        with pytest.raises(ValueError, match="longer than"):
            a.send_many([(READ, b"kept out"), (READ, b"y" * (MAX_FRAME + 1))])
        a.send_many([(READ, b"last")])
        b.read_ahead()
        got = [b.read()]
        held = [b.holds_frame()]
        got += [b.read() for _ in range(4)]
        held.append(b.holds_frame())
    assert got == [(READ, p) for p in (b"first", b"", b"x" * 100_000, b"after", b"last")]
    assert held == [True, False]  # the frames sent together were read ahead
