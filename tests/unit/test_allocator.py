"""The allocator tuning: applied on glibc (what every Linux server image here runs), a no-op elsewhere."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from pipeserve import _allocator
from pipeserve.config import InferServerSettings, ServerSettings


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds exist only in glibc")
def test_on_glibc_a_large_buffer_comes_from_the_heap_once_tuned() -> None:
    # In a fresh interpreter: a 1 MB block is mmapped (and unmapped on free) by default, heap memory once tuned.
    script = """
import ctypes
from pipeserve._allocator import tune_allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2

def mmapped_blocks_while_holding_1mb():
    block = libc.malloc(1 << 20)
    blocks = libc.mallinfo2().hblks
    libc.free(block)
    return blocks

base = libc.mallinfo2().hblks
before = mmapped_blocks_while_holding_1mb()
assert tune_allocator()
after = mmapped_blocks_while_holding_1mb()
print(before - base, after - base)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "0"]


def test_where_mallopt_is_missing_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeserve._allocator.ctypes.CDLL", lambda _: object())  # no gnu_get_libc_version
    assert _allocator.tune_allocator() is False
    monkeypatch.setattr("pipeserve._allocator.sys.platform", "darwin")
    assert _allocator.tune_allocator() is False


def test_every_server_tunes_by_default_and_the_environment_can_say_no(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerSettings().tune_allocator
    assert InferServerSettings().tune_allocator
    monkeypatch.setenv("PIPESERVE_TUNE_ALLOCATOR", "false")
    assert not ServerSettings().tune_allocator
