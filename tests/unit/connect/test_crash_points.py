"""The test-only crash points: parsed from the environment, off by default, and a SIGKILL of
the process exactly at the configured reach of the configured point."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from rivven_connect.crash_points import CRASH_AT_ENV, CrashPoints


def test_off_unless_the_variable_is_set():
    points = CrashPoints.from_environ({})
    assert points.point is None
    for _ in range(3):
        points.reach("after_send")  # nothing happens
    assert CrashPoints.from_environ({CRASH_AT_ENV: "before_commit"}).at == 1
    parsed = CrashPoints.from_environ({CRASH_AT_ENV: "after_commit_before_side_effect:4"})
    assert (parsed.point, parsed.at) == ("after_commit_before_side_effect", 4)


def test_an_unknown_point_is_refused():
    with pytest.raises(AssertionError):
        CrashPoints.from_environ({CRASH_AT_ENV: "after_lunch"})


def test_the_nth_reach_of_the_point_kills_the_process():
    program = (
        "from rivven_connect.crash_points import CrashPoints\n"
        "points = CrashPoints('before_commit', 3)\n"
        "for n in range(1, 6):\n"
        "    points.reach('after_send')\n"
        "    print(n, flush=True)\n"
        "    points.reach('before_commit')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == [b"1", b"2", b"3"]
    assert b"crash point before_commit:3 reached" in done.stderr
