"""A POSIX shared-memory segment of the node's: the engine process creates it and unlinks it when
it ends (its resource tracker unlinks it if the process dies first); workers map it by name,
without `multiprocessing.shared_memory`, whose tracker would unlink it when a worker exits."""
from __future__ import annotations

import mmap
import os
import secrets
from multiprocessing import resource_tracker

import _posixshmem


def page_up(n: int) -> int:
    return -(-n // mmap.PAGESIZE) * mmap.PAGESIZE


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or None where there is none to ask (not Linux)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class Segment:
    """The creating side: `create` it, `close` it (unmapped and unlinked)."""

    def __init__(self, name: str, mapped: mmap.mmap):
        self.name, self.map = name, mapped

    @classmethod
    def create(cls, prefix: str, size: int) -> "Segment":
        """A new segment of `size` bytes; OSError when /dev/shm has not that much free."""
        free = shm_free()
        if free is not None and free < size:
            raise OSError(f"shared memory: {size} bytes needed, {free} free")
        name = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        try:
            os.ftruncate(fd, size)
            mapped = mmap.mmap(fd, size)
        except OSError:
            _posixshmem.shm_unlink("/" + name)
            raise
        finally:
            os.close(fd)
        resource_tracker.register("/" + name, "shared_memory")
        return cls(name, mapped)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:                   # a view still held: the map goes with the views
            pass
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass
        resource_tracker.unregister("/" + self.name, "shared_memory")


def open_map(name: str, size: int, writable: bool = False) -> mmap.mmap:
    """Another process's segment `name`, mapped; ValueError when it is smaller than `size`,
    OSError when it is gone."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR if writable else os.O_RDONLY, mode=0o600)
    try:
        if os.fstat(fd).st_size < size:
            raise ValueError(f"shared memory {name}: smaller than {size} bytes")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, prot=prot)
    finally:
        os.close(fd)


def close_map(mapped: mmap.mmap) -> None:
    try:
        mapped.close()
    except BufferError:
        pass
