"""`rubric_core.background.drive` as a CLI's main thread uses it.

The Ctrl-C case is run in a process of its own: the signal and the threads are that process's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# A CLI's main thread waits in `drive` for an event that never comes (the workers of
# ``eval --workers`` stopped on the same Ctrl-C), while other threads of the process start
# threads, as DBOS's and the database's pools do: Linux may hand the SIGINT to one of those,
# and Python runs its handler only when the main thread next runs Python code. Each trial
# counts as lost when its KeyboardInterrupt came only after LOST_AFTER_S, once an event woke
# the main thread.
_SCRIPT = textwrap.dedent("""
    import asyncio, os, queue, signal, sys, threading, time
    from rubric_core.background import drive
    from rubric_core.http_retry import SharedBackoff

    TRIALS, LOST_AFTER_S = int(sys.argv[1]), float(sys.argv[2])
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Idle:  # a driver that emits nothing until stopped
        failure = None
        def __init__(self, events, stop):
            self.events, self.stop = events, stop
        async def run(self):
            while not self.stop.is_set():
                await asyncio.sleep(0.01)
            self.events.put(None)

    def start_threads():
        while True:
            thread = threading.Thread(target=lambda: None)
            thread.start()
            thread.join()

    for _ in range(2):
        threading.Thread(target=start_threads, daemon=True).start()

    lost = 0
    for _ in range(TRIALS):
        events, stop = queue.Queue(), threading.Event()
        interrupted, sent = threading.Event(), []
        def ctrl_c():
            time.sleep(0.05)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
            if not interrupted.wait(LOST_AFTER_S):
                events.put({"type": "wake"})  # the main thread runs: the Ctrl-C is raised
        events_of = drive(Idle(events, stop), events, stop, SharedBackoff(), "backoff")
        try:
            threading.Thread(target=ctrl_c, daemon=True).start()
            for _event in events_of:
                pass
        except KeyboardInterrupt:
            interrupted.set()
            if time.monotonic() - sent[0] > LOST_AFTER_S:
                lost += 1  # raised only once something else woke the main thread
        finally:
            events_of.close()
    print(f"lost {lost} of {TRIALS}")
""")


@pytest.mark.timeout(240)
def test_a_ctrl_c_taken_by_another_thread_still_interrupts_the_waiting_caller() -> None:
    trials = 40
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(trials), "2.0"],
                          capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"lost 0 of {trials}", done.stdout + done.stderr


_FREEZE_SCRIPT = textwrap.dedent("""
    import asyncio, gc, queue, threading
    from rubric_core.background import drive
    from rubric_core.http_retry import SharedBackoff

    class Once:
        def __init__(self, events, fail=False):
            self.events, self.fail, self.failure, self.frozen = events, fail, None, -1
        async def run(self):
            await asyncio.sleep(0)
            self.frozen = gc.get_freeze_count()
            self.events.put({"type": "tick"})
            if self.fail:
                self.failure = RuntimeError("the batch failed")
            self.events.put(None)

    assert gc.get_freeze_count() == 0
    first = Once(queue.Queue())
    outer = drive(first, first.events, threading.Event(), SharedBackoff(), "backoff")
    assert next(outer) == {"type": "tick"}
    assert first.frozen > 1000, first.frozen  # the modules, LangChain's and ours, at least
    second = Once(queue.Queue(), fail=True)
    try:
        list(drive(second, second.events, threading.Event(), SharedBackoff(), "backoff"))
    except RuntimeError as exc:
        assert str(exc) == "the batch failed"
    else:
        raise AssertionError("the failure was not raised")
    assert second.frozen > 1000
    assert gc.get_freeze_count() > 0, "the first batch still runs: its objects stay frozen"
    assert list(outer) == []
    assert gc.get_freeze_count() == 0, gc.get_freeze_count()
    print("ok")
""")


def test_a_batch_keeps_the_objects_it_found_out_of_full_collections_until_the_last_ends() -> None:
    """`drive` freezes what the process held when the first batch started (no full collection
    walks it while cells run) and unfreezes it when the last running batch ends, failure or
    not, so later collections free cycles among those objects again. In a process of its own:
    the freeze is the process's."""
    done = subprocess.run([sys.executable, "-c", _FREEZE_SCRIPT], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
