"""The cluster secret: sources and their precedence, the stored file, errors, join instructions."""

from __future__ import annotations

import base64
import hashlib
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from skulk.federation import (
    ClusterSecret,
    SecretError,
    SecretSource,
    join_instructions,
    load_or_create_secret,
)
from skulk.federation._secret import ENV_VAR, LoadedSecret

KEY = bytes(range(100, 132))
HEX = KEY.hex()


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def write_secret(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# ---- the secret value ----------------------------------------------------------------------------


def test_repr_and_str_never_show_the_secret() -> None:
    secret = ClusterSecret(KEY)
    for text in (repr(secret), str(secret), repr(LoadedSecret(secret, SecretSource.ENV, None))):
        assert HEX not in text and HEX.upper() not in text and repr(KEY) not in text
        assert secret.cluster_id in text
    with pytest.raises(TypeError):
        pickle.dumps(secret)


def test_cluster_id_is_derived_from_the_secret() -> None:
    secret = ClusterSecret(KEY)
    expected = hashlib.sha256(b"skulk/cluster-id/v1\x00" + KEY).hexdigest()[:16]
    assert secret.cluster_id == expected
    assert ClusterSecret(KEY).cluster_id == secret.cluster_id
    assert ClusterSecret(bytes(32)).cluster_id != secret.cluster_id
    assert ClusterSecret(KEY) == secret and ClusterSecret(bytes(32)) != secret


def test_text_forms_hex_and_base64url() -> None:
    want = ClusterSecret(KEY)
    b64 = base64.urlsafe_b64encode(KEY).decode()
    for text in (HEX, HEX.upper(), f"  {HEX}\n", b64, b64.rstrip("="), f"\t{b64}\n"):
        assert ClusterSecret.from_text(text, source="test") == want, text
    assert ClusterSecret.from_text(want.to_text(), source="test") == want


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("abcd", "too short"),
        (bytes(31).hex(), "too short"),
        ("not a secret!" * 8, "neither hex nor base64url"),
        ("a" * 5000, "too long"),
        ("A", "base64url"),  # a single base64 character decodes to nothing valid
    ],
)
def test_bad_env_values_name_the_variable(tmp_path: Path, value: str, problem: str) -> None:
    with pytest.raises(SecretError) as info:
        load_or_create_secret(tmp_path, {ENV_VAR: value})
    message = str(info.value)
    assert message.startswith(ENV_VAR) and problem in message
    if value.strip():
        assert value.strip() not in message
    assert not (tmp_path / "cluster-secret").exists()


def test_generate_uses_the_given_rng() -> None:
    secret = ClusterSecret.generate(lambda n: KEY[:n])
    assert secret == ClusterSecret(KEY)
    with pytest.raises(ValueError):
        ClusterSecret(bytes(31))


# ---- sources and precedence ----------------------------------------------------------------------


def test_first_start_creates_a_private_secret_file(tmp_path: Path) -> None:
    home = tmp_path / "home" / "skulk"
    loaded = load_or_create_secret(home, {})
    path = home / "cluster-secret"
    assert loaded.source is SecretSource.GENERATED and loaded.path == path
    assert mode_of(path) == 0o600 and mode_of(home) == 0o700
    text = path.read_text()
    assert text.endswith("\n") and len(bytes.fromhex(text.strip())) == 32
    assert ClusterSecret.from_text(text, source="x") == loaded.secret
    assert [p.name for p in home.iterdir()] == ["cluster-secret"]  # no temp file left
    assert "generated and stored in" in loaded.describe()
    assert loaded.cluster_id in loaded.describe() and text.strip() not in loaded.describe()


def test_the_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        load_or_create_secret(tmp_path, {})
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "cluster-secret") == 0o600


def test_reload_is_idempotent(tmp_path: Path) -> None:
    first = load_or_create_secret(tmp_path, {})
    again = load_or_create_secret(tmp_path, {})
    assert again.source is SecretSource.DATA_DIR and again.secret == first.secret
    assert again.cluster_id == first.cluster_id


def test_env_wins_over_file_and_data_dir(tmp_path: Path) -> None:
    write_secret(tmp_path / "cluster-secret", bytes(32).hex())
    other = write_secret(tmp_path / "other", bytes([1] * 32).hex())
    loaded = load_or_create_secret(tmp_path, {ENV_VAR: HEX}, other)
    assert loaded.source is SecretSource.ENV and loaded.path is None
    assert loaded.secret == ClusterSecret(KEY)
    assert f"${ENV_VAR}" in loaded.describe()


def test_env_does_not_touch_the_data_dir(tmp_path: Path) -> None:
    load_or_create_secret(tmp_path / "home", {ENV_VAR: HEX})
    assert not (tmp_path / "home").exists()


def test_secret_file_wins_over_the_data_dir(tmp_path: Path) -> None:
    write_secret(tmp_path / "cluster-secret", bytes(32).hex())
    given = write_secret(tmp_path / "given", HEX + "\n")
    loaded = load_or_create_secret(tmp_path, {}, given)
    assert loaded.source is SecretSource.FILE and loaded.path == given
    assert loaded.secret == ClusterSecret(KEY)


def test_a_missing_secret_file_is_an_error_not_a_new_secret(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(SecretError, match="nope"):
        load_or_create_secret(tmp_path, {}, missing)
    assert not missing.exists() and not (tmp_path / "cluster-secret").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o666])
def test_files_open_to_group_or_others_are_refused(tmp_path: Path, mode: int) -> None:
    given = write_secret(tmp_path / "given", HEX, mode)
    with pytest.raises(SecretError) as info:
        load_or_create_secret(tmp_path, {}, given)
    assert f"chmod 600 {given}" in str(info.value) and HEX not in str(info.value)
    write_secret(tmp_path / "cluster-secret", HEX, mode)
    with pytest.raises(SecretError, match="chmod 600"):
        load_or_create_secret(tmp_path, {})


def test_owner_only_modes_are_accepted(tmp_path: Path) -> None:
    given = write_secret(tmp_path / "given", HEX, 0o400)
    assert load_or_create_secret(tmp_path, {}, given).secret == ClusterSecret(KEY)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty"),
        (b"\n\n", "empty"),
        (b"zz!?" * 20, "neither hex nor base64url"),
        (b"\xff\xfe" * 40, "not text"),
        (b"a" * 10_000, "too large"),
        (b"abcdef", "too short"),
    ],
)
def test_bad_secret_files_name_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    given = tmp_path / "given"
    given.write_bytes(content)
    given.chmod(0o600)
    with pytest.raises(SecretError) as info:
        load_or_create_secret(tmp_path, {}, given)
    assert str(info.value).startswith(str(given)) and problem in str(info.value)


def test_symlinks_and_directories_are_refused(tmp_path: Path) -> None:
    real = write_secret(tmp_path / "real", HEX)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SecretError, match="symbolic link"):
        load_or_create_secret(tmp_path, {}, link)
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(SecretError):
        load_or_create_secret(tmp_path, {}, tmp_path / "dir")


def test_unwritable_data_dir_is_a_secret_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SecretError, match="Not a directory"):
        load_or_create_secret(blocker / "home", {})


# ---- concurrent first starts ------------------------------------------------------------------


def test_a_start_that_loses_the_race_uses_the_winners_secret(tmp_path: Path) -> None:
    """Another process creates the file after our read found none and before we publish: the
    rng hook runs exactly in that window."""
    winner: list[LoadedSecret] = []

    def rng(n: int) -> bytes:
        winner.append(load_or_create_secret(tmp_path, {}, rng=lambda k: bytes([7]) * k))
        return bytes([9]) * n

    loaded = load_or_create_secret(tmp_path, {}, rng=rng)
    assert winner[0].source is SecretSource.GENERATED
    assert loaded.source is SecretSource.DATA_DIR
    assert loaded.secret == winner[0].secret == ClusterSecret(bytes([7]) * 32)
    assert [p.name for p in tmp_path.iterdir()] == ["cluster-secret"]


def test_concurrent_threads_end_with_one_secret(tmp_path: Path) -> None:
    for round_ in range(10):
        home = tmp_path / str(round_)
        barrier = threading.Barrier(8)
        results: list[LoadedSecret] = []

        def start(
            home: Path = home,
            barrier: threading.Barrier = barrier,
            out: list[LoadedSecret] = results,
        ) -> None:
            barrier.wait()
            out.append(load_or_create_secret(home, {}))

        threads = [threading.Thread(target=start) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert len(results) == 8
        assert len({r.cluster_id for r in results}) == 1
        assert sum(r.source is SecretSource.GENERATED for r in results) == 1
        assert sorted(p.name for p in home.iterdir()) == ["cluster-secret"]


def test_concurrent_processes_end_with_one_secret(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path;"
        "from skulk.federation import load_or_create_secret;"
        "start = float(sys.argv[2]);"
        "time.sleep(max(0.0, start - time.time()));"
        "print(load_or_create_secret(Path(sys.argv[1]), {}).cluster_id)"
    )
    start = str(time.time() + 1.0)  # let every interpreter finish importing first
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), start],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    ids = {p.communicate(timeout=30)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(ids) == 1
    assert ids == {load_or_create_secret(tmp_path, {}).cluster_id}


# ---- join instructions ------------------------------------------------------------------------


def test_join_instructions_for_a_stored_secret() -> None:
    text = join_instructions(Path("/data/skulk/cluster-secret"), "10.1.2.3:52416", cluster_id="c1")
    assert "cluster c1" in text
    assert "/data/skulk/cluster-secret" in text and "chmod 600" in text
    assert "--cluster-secret-file" in text and "--join ws://10.1.2.3:52416" in text
    assert "THIS_HOST" not in text


def test_join_instructions_for_a_loopback_listener_are_one_line_and_a_pointer() -> None:
    text = join_instructions(Path("s"), "127.0.0.1:52416", cluster_id="c1")
    assert "\n" not in text
    assert "--listen 0.0.0.0:52416" in text and "docs/operations.md" in text
    wildcard = join_instructions(Path("s"), "0.0.0.0:52416", cluster_id="c1")
    assert "THIS_HOST" in wildcard and "--listen" not in wildcard


def test_join_instructions_for_an_env_secret() -> None:
    text = join_instructions(None, "10.1.2.3:52416", cluster_id="c1")
    assert ENV_VAR in text and "--cluster-secret-file" not in text
    assert "--join ws://10.1.2.3:52416" in text
