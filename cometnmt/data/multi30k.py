"""Multi30k task 1 (raw, cased, gzip): locate a verified local copy or download one into a cache."""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from cometnmt.atomic import atomic_write
from cometnmt.errors import DataError
from cometnmt.progress import progress_bar

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test_2016_flickr")
LANGS = ("de", "en", "fr")
DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
ENV_VAR = "COMETNMT_MULTI30K_DIR"

# sha256 of the official files in multi30k/dataset data/task1/raw/
SHA256: dict[str, str] = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

_CHUNK = 1 << 16
_TIMEOUT_S = 60.0


def file_name(split: str, lang: str) -> str:
    """Name of one Multi30k file, e.g. ``train.de.gz``; DataError for an unknown split or language."""
    if split not in SPLITS:
        raise DataError(f"unknown Multi30k split {split!r}; choose one of {', '.join(SPLITS)}")
    if lang not in LANGS:
        raise DataError(f"unknown Multi30k language {lang!r}; choose one of {', '.join(LANGS)}")
    return f"{split}.{lang}.gz"


def split_paths(root: Path, split: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """Source and target file paths of ``split`` under ``root``."""
    if src_lang == tgt_lang:
        raise DataError(f"Multi30k source and target language are both {src_lang!r}; they must differ")
    root = Path(root)
    return root / file_name(split, src_lang), root / file_name(split, tgt_lang)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/cometnmt/multi30k``, else ``~/.cache/cometnmt/multi30k``."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "cometnmt" / "multi30k"


def _needed_files(files: Iterable[str] | None, verify: bool) -> list[str]:
    """The file names to provide: ``files`` or all 9; with verify, each must have a known sum."""
    names = list(SHA256) if files is None else list(dict.fromkeys(files))
    unknown = [n for n in names if n not in SHA256]
    if verify and unknown:
        raise DataError(
            f"no known SHA-256 sum for Multi30k file(s) {', '.join(unknown)}; "
            f"known files: {', '.join(SHA256)}"
        )
    return names


def _check_sum(path: Path, name: str, what: str) -> None:
    """Raise DataError if ``path`` does not have the embedded sum of ``name``."""
    actual, expected = sha256_file(path), SHA256[name]
    if actual != expected:
        raise DataError(
            f"{path}: SHA-256 mismatch: expected {expected}, got {actual}; {what} is corrupt "
            "or not the official Multi30k task1 raw file"
        )


def _use_local(root: Path, names: list[str], verify: bool, source: str) -> Path:
    """Check that a user-given folder holds the needed files (with the right sums) and return it."""
    if not root.is_dir():
        raise DataError(f"{root}: Multi30k directory not found (given by {source})")
    for name in names:
        path = root / name
        if not path.is_file():
            raise DataError(
                f"{path}: file not found; the Multi30k directory given by {source} must hold "
                f"{', '.join(names)}"
            )
        if verify:
            _check_sum(path, name, f"the file in the directory given by {source}")
    return root


def _network_error(url: str, exc: BaseException) -> DataError:
    """DataError for a failed download, naming the URL and the offline alternative."""
    reason = getattr(exc, "reason", None) or exc
    return DataError(
        f"cannot download {url}: {reason}; check network access, or download the Multi30k task1 raw "
        f"files yourself and set {ENV_VAR} to the folder holding them"
    )


def _stream_to(url: str, out: BinaryIO, name: str) -> str:
    """Download ``url`` into ``out`` with a tqdm bar on stderr; return the hex SHA-256 of the bytes."""
    digest, received = hashlib.sha256(), 0
    try:
        resp = urllib.request.urlopen(url, timeout=_TIMEOUT_S)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _network_error(url, exc) from None
    with resp:
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        with progress_bar(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr) as bar:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except (OSError, http.client.HTTPException) as exc:
                    raise _network_error(url, exc) from None
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
    if total is not None and received != total:
        raise _network_error(url, OSError(f"truncated: got {received} of {total} bytes"))
    return digest.hexdigest()


def _download(url: str, dest: Path, expected: str | None) -> None:
    """Download to a temp file beside ``dest``, check the sum, then atomically move it into place."""
    logger.info("downloading %s -> %s", url, dest)
    with atomic_write(dest, "wb") as out:  # a failed check (an exception) discards the temporary file
        actual = _stream_to(url, out, dest.name)
        if expected is not None and actual != expected:
            raise DataError(
                f"{url}: downloaded file has SHA-256 {actual}, expected {expected}; it was discarded. "
                f"Retry later, or set {ENV_VAR} to a folder holding verified copies"
            )


def _is_cached(path: Path, name: str, verify: bool) -> bool:
    """True if ``path`` exists and (when verifying) has the right sum."""
    if not path.is_file():
        return False
    if not verify or sha256_file(path) == SHA256[name]:
        return True
    logger.warning("%s: cached file has a wrong SHA-256 sum; downloading it again", path)
    return False


STALE_PART_SECONDS = 3600  # a temporary download untouched this long was left by a killed process


def _remove_stale_parts(dest: Path) -> None:
    """Remove the temporary files (``.NAME.*.tmp``, atomic_write's) that a download killed outright
    (``kill -9``, a lost machine) left beside ``dest``: nothing removed them, and each held up to
    the whole file. One written to within the hour may be another process's download in progress."""
    for part in dest.parent.glob(f".{dest.name}.*.tmp"):
        try:
            if time.time() - part.stat().st_mtime > STALE_PART_SECONDS:
                part.unlink()
                logger.info("removed %s, a download left unfinished", part)
        except OSError:  # gone meanwhile, or not ours to remove: left as it is
            pass


def _download_missing(cache: Path, base_url: str, names: list[str], verify: bool) -> Path:
    """Download every needed file not already cached (with the right sum) into ``cache``."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{cache}: cannot create the Multi30k cache directory ({exc.strerror or exc})") from None
    base = base_url if base_url.endswith("/") else base_url + "/"
    for name in names:
        dest = cache / name
        if _is_cached(dest, name, verify):
            continue
        _remove_stale_parts(dest)
        try:
            _download(base + name, dest, SHA256.get(name) if verify else None)
        except OSError as exc:  # local disk errors; network errors are DataError already
            raise DataError(f"{dest}: cannot write the downloaded file ({exc.strerror or exc})") from None
    return cache


def resolve_dir(
    local_dir: str | None = None,
    *,
    cache_dir: str | Path | None = None,
    base_url: str = DEFAULT_URL,
    files: Iterable[str] | None = None,
    verify: bool = True,
    key: str = "local_dir",
) -> Path:
    """Return a folder holding the needed Multi30k files (default: all 9), verified by SHA-256.

    ``local_dir``, else ``$COMETNMT_MULTI30K_DIR`` ("~" is the home folder), is used as is (never
    downloads into it); errors name it as ``key`` (the config reader passes ``data.multi30k_dir``).
    Otherwise missing files are downloaded from ``base_url`` into ``cache_dir``.
    """
    names = _needed_files(files, verify)
    if local_dir:
        return _use_local(Path(local_dir).expanduser(), names, verify, key)
    env_dir = os.environ.get(ENV_VAR)
    if env_dir:
        return _use_local(Path(env_dir).expanduser(), names, verify, f"${ENV_VAR}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _download_missing(cache, base_url, names, verify)
