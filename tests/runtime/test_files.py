"""dualjax.runtime.files: a settled file's digest is read once a process."""
import hashlib
import os
import time

from dualjax.runtime import files


def test_a_settled_files_digest_is_read_once_and_a_fresh_one_each_time(tmp_path, monkeypatch):
    """A run read its pairs file's and weights' sha256 seven times before its first
    table. A file last modified SETTLED_S ago is read once (a rewrite gives it a newer
    time, so another key); a file modified just now is read every time: a rewrite of the
    same size within the clock's tick would keep its time."""
    reads = []
    digest = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, name: reads.append(f.name)
                        or digest(f, name))
    path = tmp_path / "pairs.tsv"
    path.write_bytes(b"a\tb\n")
    settled = time.time_ns() - int(10e9)
    os.utime(path, ns=(settled, settled))
    assert files.sha256_of(path) == files.sha256_of(str(path)) == hashlib.sha256(
        b"a\tb\n").hexdigest()
    assert len(reads) == 1
    path.write_bytes(b"c\td\n")  # rewritten: a newer time, read again
    assert files.sha256_of(path) == hashlib.sha256(b"c\td\n").hexdigest()
    now = os.stat(path).st_mtime_ns
    path.write_bytes(b"e\tf\n")  # the same size, and (forced) the same time: a tick
    os.utime(path, ns=(now, now))
    assert files.sha256_of(path) == hashlib.sha256(b"e\tf\n").hexdigest()
    assert len(reads) == 3
