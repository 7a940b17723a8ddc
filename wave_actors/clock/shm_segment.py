"""A POSIX shared-memory segment of the node's: the engine process creates it and unlinks it when
it ends (its resource tracker unlinks it if the process dies first); workers map it by name,
without `multiprocessing.shared_memory`, whose tracker would unlink it when a worker exits."""
from __future__ import annotations

import mmap
import os
import platform
import secrets
from multiprocessing import resource_tracker

import _posixshmem


# Hosts whose stores and loads stay in program order (x86's total store order): the shared
# rings' stamps are written after their payloads and read after them with plain numpy stores
# and loads, which a weaker order (Arm: Grace Hopper) may reorder, so a torn frame could pass
# its stamp check there. Elsewhere the rings are not shared: frames and outputs travel in
# messages, which are correct on any host.
STORE_ORDERED = ("x86_64", "amd64", "i386", "i686")


def unordered_host(machine: str | None = None) -> str | None:
    """Why this host may not share the rings (None: it may)."""
    machine = (machine or platform.machine()).lower()
    if machine in STORE_ORDERED:
        return None
    return (f"this host ({machine}) may reorder plain stores and loads; the shared rings are "
            f"used on x86 only")


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
