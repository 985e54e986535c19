"""Tests of Multi30k resolution: local folders, env var, and download + verification from a local HTTP server."""

from __future__ import annotations

import functools
import os
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cometnmt.data import multi30k
from cometnmt.data.multi30k import ENV_VAR, SHA256, resolve_dir, split_paths
from cometnmt.errors import DataError

VAL_FILES = ["val.de.gz", "val.en.gz"]
_ENV_AT_IMPORT = os.environ.get(ENV_VAR)  # read before the autouse fixture clears it


def multi30k_dir() -> Path:
    """The shared Multi30k copy: $COMETNMT_MULTI30K_DIR, else ../shared/data/multi30k beside the repo."""
    env = _ENV_AT_IMPORT
    root = Path(env) if env else Path(__file__).parents[1] / ".." / "shared" / "data" / "multi30k"
    if not root.is_dir():
        pytest.skip(f"shared Multi30k copy not found at {root} (set {ENV_VAR})")
    return root


@dataclass
class Server:
    """A local HTTP server over ``root``; ``requests`` lists the paths asked for."""

    root: Path
    url: str
    requests: list[str]


class _Handler(SimpleHTTPRequestHandler):
    """Serves files, records request paths, logs nothing, and gives up on idle connections."""

    timeout = 10
    seen: list[str]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        pass

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        self.seen.append(self.path)
        super().do_GET()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No env override, no proxy for 127.0.0.1, and a private XDG cache."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    shared = multi30k_dir()
    root = tmp_path / "served"
    root.mkdir()
    for name in VAL_FILES:
        shutil.copyfile(shared / name, root / name)
    seen: list[str] = []
    handler = functools.partial(type("H", (_Handler,), {"seen": seen}), directory=str(root))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Server(root, f"http://127.0.0.1:{httpd.server_port}/", seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def test_download_verifies_then_uses_cache(server: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    root = resolve_dir(cache_dir=cache, base_url=server.url, files=VAL_FILES)
    assert root == cache
    assert sorted(server.requests) == ["/val.de.gz", "/val.en.gz"]
    assert sorted(p.name for p in cache.iterdir()) == VAL_FILES
    for name in VAL_FILES:
        assert multi30k.sha256_file(cache / name) == SHA256[name]
    assert resolve_dir(cache_dir=cache, base_url=server.url, files=VAL_FILES) == cache
    assert len(server.requests) == 2, "second call must not download again"
    src, tgt = split_paths(root, "val", "de", "en")
    assert src.is_file() and tgt.is_file()


def test_default_cache_is_under_xdg(server: Server, tmp_path: Path) -> None:
    root = resolve_dir(base_url=server.url.rstrip("/"), files=["val.en.gz"])
    assert root == tmp_path / "xdg" / "cometnmt" / "multi30k"
    assert (root / "val.en.gz").is_file()


def test_corrupt_download_is_rejected_and_removed(server: Server, tmp_path: Path) -> None:
    data = bytearray((server.root / "val.de.gz").read_bytes())
    data[100] ^= 0xFF
    (server.root / "val.de.gz").write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as info:
        resolve_dir(cache_dir=cache, base_url=server.url, files=["val.de.gz"])
    msg = str(info.value)
    assert "SHA-256" in msg and SHA256["val.de.gz"] in msg and "val.de.gz" in msg
    assert list(cache.iterdir()) == [], "neither the corrupt file nor a temp file may stay in the cache"


def test_corrupt_cached_file_is_downloaded_again(server: Server, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "val.en.gz").write_bytes(b"not the real file")
    resolve_dir(cache_dir=cache, base_url=server.url, files=["val.en.gz"])
    assert server.requests == ["/val.en.gz"]
    assert multi30k.sha256_file(cache / "val.en.gz") == SHA256["val.en.gz"]


def test_a_download_left_unfinished_by_a_kill_is_removed(server: Server, tmp_path: Path) -> None:
    """A download killed outright (kill -9) left its temporary file, up to the whole file, beside
    the cache's files for good. The next download of that file removes it once an hour old; a
    younger one may be another process's download in progress, and another file's is not touched."""
    import os
    import time

    cache = tmp_path / "cache"
    cache.mkdir()
    old, young, other = (cache / ".val.en.gz.ab12.tmp", cache / ".val.en.gz.cd34.tmp", cache / ".val.de.gz.ef56.tmp")
    for part in (old, young, other):
        part.write_bytes(b"part of a download")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    os.utime(other, (hours_ago, hours_ago))
    resolve_dir(cache_dir=cache, base_url=server.url, files=["val.en.gz"])
    assert sorted(p.name for p in cache.iterdir()) == sorted([young.name, other.name, "val.en.gz"])


def test_network_errors_name_url_and_env_var(server: Server, tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        resolve_dir(cache_dir=tmp_path / "c1", base_url=server.url, files=["train.fr.gz"])  # 404
    assert f"{server.url}train.fr.gz" in str(info.value) and ENV_VAR in str(info.value)
    url = _closed_port_url()
    with pytest.raises(DataError) as info:
        resolve_dir(cache_dir=tmp_path / "c2", base_url=url, files=["val.de.gz"])
    assert f"{url}val.de.gz" in str(info.value) and ENV_VAR in str(info.value)
    assert list((tmp_path / "c2").iterdir()) == []


def test_local_dir_and_env_var_use_no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = multi30k_dir()
    offline = _closed_port_url()
    assert resolve_dir(str(shared), base_url=offline, cache_dir=tmp_path / "c") == shared  # all 9 files
    monkeypatch.setenv(ENV_VAR, str(shared))
    assert resolve_dir(base_url=offline, cache_dir=tmp_path / "c", files=VAL_FILES) == shared
    assert not (tmp_path / "c").exists()


def test_local_dir_with_wrong_or_missing_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = multi30k_dir()
    local = tmp_path / "local"
    local.mkdir()
    shutil.copyfile(shared / "val.en.gz", local / "val.de.gz")  # wrong content under the right name
    shutil.copyfile(shared / "val.en.gz", local / "val.en.gz")
    with pytest.raises(DataError) as info:
        resolve_dir(str(local), files=VAL_FILES)
    msg = str(info.value)
    assert str(local / "val.de.gz") in msg and SHA256["val.de.gz"] in msg and SHA256["val.en.gz"] in msg
    monkeypatch.setenv(ENV_VAR, str(local))
    with pytest.raises(DataError, match=rf"{local / 'val.fr.gz'}: file not found"):
        resolve_dir(files=["val.en.gz", "val.fr.gz"])
    with pytest.raises(DataError, match=r"Multi30k directory not found \(given by local_dir\)"):
        resolve_dir(str(tmp_path / "missing"))
    with pytest.raises(DataError, match=rf"given by \${ENV_VAR} must hold"):
        resolve_dir(files=["val.fr.gz"])


def test_a_config_names_its_multi30k_dir_key(tmp_path: Path) -> None:
    """Before: 'given by data.multi30k_dir (local_dir)' from the config and the API alike."""
    from cometnmt.config import load_config
    from cometnmt.data.pipeline import split_files

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", [f"data.multi30k_dir={tmp_path / 'missing'}"])
    with pytest.raises(DataError, match=r"not found \(given by config key 'data.multi30k_dir'\)$"):
        split_files(cfg.data, "valid")
