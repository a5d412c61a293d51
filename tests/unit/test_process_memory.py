"""``keep_freed_memory``: MiB-sized buffers, allocated one after another, stop faulting pages.

Goal: after ``keep_freed_memory()`` a process that allocates, fills and frees MiB-sized byte
strings in turn (what a fetch does) reuses freed heap blocks instead of taking fresh pages from
the kernel. Method: a fresh interpreter per case (the setting is process-wide) runs that
pattern, growing each buffer a little so glibc's own adaptive threshold never catches up, and
counts its minor page faults (``getrusage``); the same pattern untuned shows what is saved.
Linux with glibc only.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)

#: Source defining ``faults_per_block()``: fill and free 64 MiB-sized buffers in turn (what a
#: fetch does), each a little larger than the last, and return minor page faults per buffer.
#: Shared with the Spark worker test (tests/unit/spark/test_worker_process.py).
FAULTS_PER_BLOCK_SOURCE = """
import resource
def faults_per_block():
    for _ in range(3):
        b"x" * (1 << 21)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(64):
        block = b"x" * ((2 << 20) + i * 4096)  # written in full, like a received fetch answer
        del block
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 64
"""

_PATTERN = FAULTS_PER_BLOCK_SOURCE + """
import sys
tuned = None
if sys.argv[1] == "tuned":
    from rivven_broker.process_memory import keep_freed_memory
    tuned = keep_freed_memory()
print(tuned, faults_per_block())
"""


def measure(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", _PATTERN, mode], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return out[0], float(out[1])


def test_freed_blocks_are_reused_instead_of_faulting_fresh_pages() -> None:
    _, untuned = measure("default")
    if untuned < 64:
        pytest.skip(f"this allocator reuses these blocks on its own ({untuned} faults/block)")
    applied, tuned = measure("tuned")
    assert applied == "True"
    assert tuned < 16, (tuned, untuned)  # a 2 MiB block is 512 pages
