"""Per-run logs: what a handler logs and prints is kept for its run (or job attempt) only,
bounded to its head and tail, stored with the run, pruned with it, and read through the
declared actions (embedded, over HTTP, remote).

Handlers here write markers naming their own run; a log holding another run's marker
would be a capture that mixed runs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import queue
import re
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from multiprocessing.pool import ThreadPool
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from backend import Engine, ManualClock, define_durable, define_queue, define_schedule, discover
from backend.api.app import create_app
from backend.client.embedded import EmbeddedBackend
from backend.client.remote import RemoteBackend
from backend.errors import BadInput, NotFound, Unavailable
from backend.observability import capture
from backend.observability.capture import HEAD_BYTES, TAIL_BYTES, LogBuffer
from backend.observability.logs import LogStore, LogTarget, StoredLog, compose
from backend.store import open_store
from console.cli.jobs import detail_text
from tests import pg

log = logging.getLogger("tests.run_logs")
log.setLevel(logging.INFO)

TOKEN = "run-logs-token"
NOT_AN_ID = "01JD3Z6Q0V9W4C7PAXH3KJ1M2B"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        request.getfixturevalue("pg_server")
        return pg.database_for(tmp_path)
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def engines(clock: ManualClock, url: str) -> AsyncIterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(definitions: list[Any], **kwargs: Any) -> Engine:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("instance", f"logs-{len(made)}")
        kwargs.setdefault("shutdown_grace", 0)
        engine = Engine(definitions, url, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        await engine.stop(grace=0)


def markers(text: str) -> set[str]:
    return set(re.findall(r"<<([^>]+)>>", text))


# ---------------------------------------------------------------------------------------
# the buffer: bounded, head and tail, whole characters
# ---------------------------------------------------------------------------------------
def test_a_megabyte_streamed_keeps_its_head_and_tail_and_never_more() -> None:
    buffer = LogBuffer()
    lines = [f"line {n:06d} {'x' * 50}\n" for n in range(16_500)]  # ~1 MiB
    for line in lines:
        buffer.write(line)
        assert len(buffer._head) <= HEAD_BYTES
        assert buffer._tail_size <= TAIL_BYTES
    shot = buffer.snapshot()
    total = sum(len(line) for line in lines)
    assert total > 1_000_000 and shot.size == total
    assert shot.head.startswith(lines[0]) and shot.tail.endswith(lines[-1])
    assert len(shot.head.encode()) + shot.omitted_bytes + len(shot.tail.encode()) == total
    assert shot.omitted_lines == len(lines) - shot.head.count("\n") - shot.tail.count("\n")
    text = compose(shot.head, shot.tail, shot.size, shot.omitted_bytes, shot.omitted_lines)
    marker = f"[… {shot.omitted_bytes:,} bytes ({shot.omitted_lines:,} lines) left out"
    assert text.count(marker) == 1
    assert len(text.encode()) < HEAD_BYTES + TAIL_BYTES + 200


def test_one_huge_write_is_cut_at_character_boundaries() -> None:
    buffer = LogBuffer(head=10, tail=10)
    buffer.write("é" * 1000)  # two bytes each: the cuts must not split one
    shot = buffer.snapshot()
    assert shot.head == "é" * 5 and shot.tail == "é" * 5
    assert shot.size == 2000 and shot.omitted_bytes == 1980
    buffer.write("ab€")  # three bytes: the tail's room shifts by one character at a time
    shot = buffer.snapshot()
    assert "\ufffd" not in shot.tail and shot.tail.endswith("ab€")
    assert len(shot.head.encode()) + shot.omitted_bytes + len(shot.tail.encode()) == shot.size


def test_what_a_store_cannot_keep_is_escaped_and_a_closed_buffer_takes_nothing() -> None:
    buffer = LogBuffer()
    buffer.write("nul \x00 and lone \udcff\n")
    buffer.close()
    buffer.write("after the end\n")
    shot = buffer.snapshot()
    assert shot.head == "nul \\x00 and lone \\udcff\n" and shot.final


def test_following_by_offsets_prints_each_byte_once_and_says_what_was_left_out() -> None:
    buffer = LogBuffer(head=64, tail=64)
    printed, after = "", 0

    def read() -> None:
        nonlocal printed, after
        shot = buffer.snapshot()
        printed += compose(shot.head, shot.tail, shot.size, shot.omitted_bytes, shot.omitted_lines, after)
        after = shot.size

    for n in range(12):  # read after every line: every byte once, in order
        buffer.write(f"line {n:02d}\n")
        read()
    assert printed == "".join(f"line {n:02d}\n" for n in range(12))
    for n in range(12, 40):  # the tail moves on past what was read
        buffer.write(f"line {n:02d}\n")
    read()
    gap = 8 * 40 - 64 - 8 * 12  # written, less the tail, less what was read before
    assert printed.endswith(f"line 11\n[… {gap} bytes left out: a log keeps its first and last 32 KiB …]\n"
                            + "".join(f"line {n:02d}\n" for n in range(32, 40)))
    read()
    assert printed.endswith("line 39\n")  # nothing new: nothing more


def held(part: Any) -> int:
    """The memory a part of a buffer holds: its size, and its chunks' if it has any."""
    if isinstance(part, list | deque):
        return sys.getsizeof(part) + sum(held(chunk) for chunk in part)
    return sys.getsizeof(part)


def test_a_log_written_a_few_bytes_at_a_time_holds_at_most_twice_its_bound() -> None:
    """Found by an outside attack: a buffer kept one object per write, in its head and in its
    tail, and held 6 to 22 times its 64 KiB in memory when a handler wrote a few bytes at a
    time (``print(x, end="")``, a counter). Writes share chunks now: what a buffer holds is
    within twice what it keeps, and what it keeps is the same however the text was cut."""
    buffer = LogBuffer()
    for _ in range(200_000):
        buffer.write("ab")
    assert held(buffer._head) + held(buffer._tail) <= 2 * (HEAD_BYTES + TAIL_BYTES)
    shot = buffer.snapshot()
    assert (shot.head, shot.tail) == ("ab" * (HEAD_BYTES // 2), "ab" * (TAIL_BYTES // 2))
    assert (shot.size, shot.omitted_bytes) == (400_000, 400_000 - HEAD_BYTES - TAIL_BYTES)

    text = "".join(f"line {n} é€ {'z' * (n % 97)}\n" for n in range(3000))
    whole, pieces = LogBuffer(head=1000, tail=1000), LogBuffer(head=1000, tail=1000)
    whole.write(text)
    at, sizes = 0, [1, 2, 3, 5, 8, 13, 700, 4100]  # a piece from one character to past a chunk
    while at < len(text):
        size = sizes[at % len(sizes)]
        pieces.write(text[at : at + size])
        at += size
    one, many = whole.snapshot(), pieces.snapshot()
    assert (one.head, one.tail, one.size, one.omitted_bytes, one.omitted_lines) == (
        many.head, many.tail, many.size, many.omitted_bytes, many.omitted_lines)  # fmt: skip


# ---------------------------------------------------------------------------------------
# capture: per run, from threads, child tasks and pools, many at once
# ---------------------------------------------------------------------------------------
ASYNC, SYNC = 12, 12


def concurrent_definitions(barrier: threading.Barrier) -> list[Any]:
    async def async_handler(ctx: Any) -> None:
        me = ctx.name

        async def child() -> None:
            for _n in range(3):
                print(f"<<{me}:child>>")
                await asyncio.sleep(0)

        task = asyncio.create_task(child())
        for _n in range(5):
            print(f"<<{me}:print>>")
            log.info("<<%s:log>>", me)
            await asyncio.sleep(0)
        thread = threading.Thread(target=lambda: print(f"<<{me}:thread>>", file=sys.stderr))
        thread.start()
        await asyncio.to_thread(thread.join)
        await asyncio.get_running_loop().run_in_executor(None, lambda: log.warning("<<%s:pool>>", me))
        await task

    def sync_handler(ctx: Any) -> None:
        me = ctx.name
        barrier.wait(timeout=30)  # every sync handler runs at once
        for _n in range(5):
            print(f"<<{me}:print>>")
            log.info("<<%s:log>>", me)
        thread = threading.Thread(target=lambda: log.warning("<<%s:thread>>", me))
        thread.start()
        thread.join()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pool.submit(print, f"<<{me}:pool>>").result()
        barrier.wait(timeout=30)

    return [
        *(define_schedule(name=f"a{n:02d}", cron="* * * * *", timezone="UTC", handler=async_handler) for n in range(ASYNC)),
        *(define_schedule(name=f"s{n:02d}", cron="* * * * *", timezone="UTC", handler=sync_handler) for n in range(SYNC)),
    ]


async def test_logs_of_concurrent_runs_are_never_mixed(engines: Callable[..., Engine], clock: ManualClock) -> None:
    engine = engines(concurrent_definitions(threading.Barrier(SYNC)))
    await engine.start()
    clock.advance(60)  # every schedule's slot at once: async on the loop, sync on 12 threads
    await engine.quiesce()
    runs = {name: (await engine.list_runs(name, limit=1))[0][0] for name in engine.schedules}
    for name, run in runs.items():
        assert run.status == "succeeded", (name, run.error_message)
        answer = await engine.run_logs.run_log(run.id)
        seen = markers(answer.text)
        kinds = {"print", "log", "child", "thread", "pool"} if name.startswith("a") else {"print", "log", "thread", "pool"}
        assert seen == {f"{name}:{kind}" for kind in kinds}, (name, answer.text)
        assert not answer.running and answer.status == "succeeded"
        assert answer.text.count(f"<<{name}:print>>") == 5


async def test_a_thread_pool_a_run_made_runs_each_runs_work_in_its_own_log(engines: Callable[..., Engine]) -> None:
    """Found by an outside attack: a ``multiprocessing.pool.ThreadPool`` made lazily by
    whichever run needed it first, then shared, had its threads carry that run's capture for
    good: another run's work on it went to the first run's log. As a ``ThreadPoolExecutor``'s,
    its threads carry no capture, and each piece of work runs in its submitter's."""
    shared: list[ThreadPool] = []
    first_used, second_done = threading.Event(), threading.Event()

    def pool() -> ThreadPool:
        if not shared:
            shared.append(ThreadPool(2))
        return shared[0]

    def first(ctx: Any) -> None:
        pool().apply(print, ("<<first:apply>>",))
        first_used.set()
        second_done.wait(30)  # still running while the second run uses the pool

    def second(ctx: Any) -> None:
        first_used.wait(30)
        work = pool()
        work.apply(print, ("<<second:apply>>",))
        work.apply_async(log.warning, ("<<second:apply_async>>",)).get(30)
        work.map(print, ["<<second:map>>"] * 4, chunksize=1)
        work.starmap(print, [("<<second:starmap>>",)] * 2)
        list(work.imap(print, ["<<second:imap>>"] * 2))
        list(work.imap_unordered(print, ["<<second:imap_unordered>>"] * 4, chunksize=2))
        second_done.set()

    engine = engines([define_schedule(name="first", cron="0 * * * *", timezone="UTC", handler=first),
                      define_schedule(name="second", cron="0 * * * *", timezone="UTC", handler=second)])  # fmt: skip
    await engine.open()
    try:
        runs = await asyncio.gather(engine.run_now("first", wait=True), engine.run_now("second", wait=True))
    finally:
        for made in shared:
            await asyncio.to_thread(made.terminate)
    await engine.run_logs.flush()
    texts = [(await engine.run_logs.run_log(run.id)).text for run in runs]
    assert markers(texts[0]) == {"first:apply"}, texts[0]
    kinds = {"apply", "apply_async", "map", "starmap", "imap", "imap_unordered"}
    assert markers(texts[1]) == {f"second:{kind}" for kind in kinds}, texts[1]
    assert texts[1].count("<<second:map>>") == texts[1].count("<<second:imap_unordered>>") == 4


async def test_a_thread_a_run_left_running_writes_into_no_log_once_that_run_has_ended(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Found by an outside attack: a library's worker thread, started on first use by
    whichever run used it first (an SDK's background sender), carried that run's capture for
    good: a run that had written nothing got a log after its end, of what the thread did for
    later runs. Once its run has ended, such a thread writes into no run's log: the process's
    output only, as code outside any run (and the process's log says so once)."""
    items: queue.Queue[str | None] = queue.Queue()
    sent = threading.Event()
    senders: list[threading.Thread] = []

    def sender() -> None:
        while (item := items.get()) is not None:
            print(f"sent {item}")
            sent.set()

    def send_in_background(item: str | None) -> None:
        if not senders:  # started on first use
            senders.append(threading.Thread(target=sender, daemon=True))
            senders[0].start()
        if item is not None:
            items.put(item)

    def first(ctx: Any) -> None:
        send_in_background(None)  # (a client made, nothing sent yet: the run writes nothing)

    def second(ctx: Any) -> None:
        print("<<second:print>>")
        send_in_background("<<second:sent>>")
        assert sent.wait(30)

    engine = engines([define_schedule(name="first", cron="0 * * * *", timezone="UTC", handler=first),
                      define_schedule(name="second", cron="0 * * * *", timezone="UTC", handler=second)])  # fmt: skip
    await engine.open()
    earlier = await engine.run_now("first", wait=True)
    await engine.quiesce()  # it has ended
    later = await engine.run_now("second", wait=True)
    items.put(None)
    await asyncio.to_thread(senders[0].join, 30)
    await engine.run_logs.flush()
    assert (await engine.run_logs.run_log(earlier.id)).size == 0
    assert (await engine.run_logs.run_log(later.id)).text == "<<second:print>>\n"
    assert "sent <<second:sent>>" in capsys.readouterr().out
    assert [r.getMessage() for r in caplog.records if "output written after it ended" in r.getMessage()] == [
        f"run {earlier.id}: output written after it ended (by a thread it left running?) is not kept in its log; "
        "it reaches the process's output only"
    ]


async def test_a_log_record_reaches_the_process_handlers_too_and_a_print_its_stream(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    async def handler(ctx: Any) -> None:
        print("<<printed>>")
        log.warning("<<logged>>")

    engine = engines([define_schedule(name="both", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    run = await engine.run_now("both", wait=True)
    await engine.run_logs.flush()
    text = (await engine.run_logs.run_log(run.id)).text
    assert markers(text) == {"printed", "logged"}
    assert "<<printed>>" in capsys.readouterr().out  # a copy: the stream still gets it
    assert any("<<logged>>" in record.getMessage() for record in caplog.records)


async def test_a_record_a_process_handler_writes_to_stdout_is_captured_once(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an outside attack: a process logging through a handler that writes to
    stdout but is no ``StreamHandler`` (rich's ``RichHandler``, one that prints) had each
    record twice in the run's log, as the handler rendered it and as the record's line. The
    record's line is the one copy; the handler's rendering still reaches the stream, and a
    print of the handler's own is captured as before."""

    class Rendering(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sys.stdout.write(f"rendered: {record.getMessage()}\n")

    def handler(ctx: Any) -> None:
        log.warning("<<one record>>")
        print("<<a print>>")

    engine = engines([define_schedule(name="rich", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    rendering = Rendering()
    logging.getLogger().addHandler(rendering)
    try:
        run = await engine.run_now("rich", wait=True)
    finally:
        logging.getLogger().removeHandler(rendering)
    await engine.run_logs.flush()
    text = (await engine.run_logs.run_log(run.id)).text
    assert text.count("<<one record>>") == 1 and re.search(r"Z WARNING tests\.run_logs: <<one record>>\n", text), text
    assert markers(text) == {"one record", "a print"}
    assert "rendered: <<one record>>" in capsys.readouterr().out


async def test_bytes_written_to_the_streams_binary_layer_are_captured(engines: Callable[..., Engine]) -> None:
    """``sys.stdout.buffer.write`` went round the capture: those lines were missing from
    the run's log (and reached serve's own output raw)."""

    def handler(ctx: Any) -> None:
        print("<<text>>", flush=True)
        sys.stdout.buffer.write("<<bytes é>>\n".encode())
        sys.stdout.buffer.flush()
        sys.stderr.buffer.writelines([b"<<err ", b"bytes>>\n"])

    engine = engines([define_schedule(name="binary", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    run = await engine.run_now("binary", wait=True)
    await engine.run_logs.flush()
    text = (await engine.run_logs.run_log(run.id)).text
    assert "<<text>>" in text and "<<bytes é>>" in text and "<<err bytes>>" in text, text
    assert sys.stdout.buffer is sys.stdout.buffer  # (one binary layer, as the real stream has)


async def test_a_handler_that_closes_the_process_streams_closes_nothing(engines: Callable[..., Engine]) -> None:
    """``sys.stderr.close()`` in a handler closed the process's stderr: every later run that
    wrote to it stayed ``running`` for good, and serve failed at its stop (exit 1)."""

    def closer(ctx: Any) -> None:
        print("<<closing>>")
        sys.stdout.close()
        sys.stderr.close()
        sys.stdout.buffer.close()

    def speaker(ctx: Any) -> None:
        print("<<printed>>")
        print("<<to stderr>>", file=sys.stderr)
        log.warning("<<logged>>")

    engine = engines([define_schedule(name="closer", cron="0 * * * *", timezone="UTC", handler=closer),
                      define_schedule(name="speaker", cron="0 * * * *", timezone="UTC", handler=speaker)])  # fmt: skip
    await engine.open()
    closed = await engine.run_now("closer", wait=True)
    assert (closed.status, sys.stdout.closed, sys.stderr.closed) == ("succeeded", False, False)
    for _ in range(2):
        run = await engine.run_now("speaker", wait=True)
        assert run.status == "succeeded", run.error_message
        await engine.run_logs.flush()
        assert markers((await engine.run_logs.run_log(run.id)).text) == {"printed", "to stderr", "logged"}


async def test_a_run_in_flight_when_a_firing_console_quits_keeps_its_log(
    engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Textual redirects stdout and stderr while the app runs, and puts back what it found
    when it quits: over the run logs' proxies. A run still in flight during the console's
    grace printed onto the terminal, and its log stopped at the quit."""
    import contextlib

    from console.cli.tui import _run_console

    started, quit_ = asyncio.Event(), asyncio.Event()

    async def ticker(ctx: Any) -> None:
        print("<<before the quit>>")
        started.set()
        await quit_.wait()
        print("<<after the quit>>")

    class App:  # what Textual's run_async does to the streams
        async def run_async(self) -> None:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                run = asyncio.ensure_future(engine.run_now("ticker", wait=True))
                await started.wait()
            self.run = run
            quit_.set()  # quit: the streams are put back, and the run goes on

        def exit(self) -> None:
            pass

    engine = engines([define_schedule(name="ticker", cron="0 * * * *", timezone="UTC", handler=ticker)])
    app = App()
    backend = EmbeddedBackend(engine)
    await engine.open()
    # The terminal's own streams, as the app finds them (the console starts its engine in
    # the app, so the proxies went in front of the app's redirects, not of these).
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert await _run_console(app, backend) == 0
    run = await app.run
    reader = engines([])  # (the console closed its engine and store)
    await reader.open()
    text = (await reader.run_logs.run_log(run.id)).text
    assert markers(text) == {"before the quit", "after the quit"}, text


def test_a_byte_that_is_not_utf8_is_captured_as_its_escape_and_passed_on_as_it_is() -> None:
    raw = io.BytesIO()
    said = capture.Capture()
    said.buffer = capture.LogBuffer()
    token = capture.CURRENT.set(said)
    try:
        assert capture.CapturingBytes(raw).write(b"ok \xff\xfe \xc3\xa9\n") == 9
    finally:
        capture.CURRENT.reset(token)
    assert raw.getvalue() == b"ok \xff\xfe \xc3\xa9\n"
    snapshot = said.buffer.snapshot()
    assert snapshot.head + snapshot.tail == "ok \\xff\\xfe é\n"


async def test_outside_a_run_nothing_is_captured_and_the_last_resort_still_speaks(
    engines: Callable[..., Engine], capsys: pytest.CaptureFixture[str]
) -> None:
    engine = engines([define_schedule(name="quiet", cron="0 * * * *", timezone="UTC", handler=lambda ctx: None)])
    await engine.open()
    assert capture.installed() and capture.CURRENT.get() is None
    root = logging.getLogger()
    others, root.handlers[:] = list(root.handlers), [capture.HANDLER]
    try:
        logging.getLogger("tests.nobody").warning("no handler but the capture's")
    finally:
        root.handlers[:] = others
    assert "no handler but the capture's" in capsys.readouterr().err
    run = await engine.run_now("quiet", wait=True)
    await engine.run_logs.flush()
    assert (await engine.run_logs.run_log(run.id)).size == 0
    assert engine.run_logs.writes == 0  # a run that says nothing costs no write


async def test_a_failing_handler_ends_its_log_with_its_traceback(engines: Callable[..., Engine]) -> None:
    def handler(ctx: Any) -> None:
        print("about to fail")
        raise RuntimeError("<<the reason>>")

    engine = engines([define_schedule(name="fails", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    run = await engine.run_now("fails", wait=True)
    await engine.run_logs.flush()
    text = (await engine.run_logs.run_log(run.id)).text
    assert text.startswith("about to fail\n")
    assert "Traceback (most recent call last)" in text and text.endswith("RuntimeError: <<the reason>>\n")
    assert run.traceback is not None and "RuntimeError" in run.traceback  # kept in the run as before


async def test_quiesce_keeps_the_logs_a_store_cut_off_cannot_take_and_writes_them_after(
    engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    def handler(ctx: Any) -> None:
        print("said while the store is away")

    engine = engines([define_schedule(name="talks", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    healthy = cast(LogStore, engine.store).save_logs

    async def cut(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("cut off")

    monkeypatch.setattr(engine.store, "save_logs", cut)
    run = await engine.run_now("talks", wait=True)
    await engine.quiesce(runs=False)  # the logs wait: quiescing is not failing
    monkeypatch.setattr(engine.store, "save_logs", healthy)
    await engine.run_logs.flush()
    assert (await engine.run_logs.run_log(run.id)).text == "said while the store is away\n"


async def test_a_megabyte_of_output_is_kept_bounded(engines: Callable[..., Engine]) -> None:
    def handler(ctx: Any) -> None:
        for n in range(16_000):
            print(f"row {n:05d} " + "y" * 56)

    engine = engines([define_schedule(name="loud", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    run = await engine.run_now("loud", wait=True)
    await engine.run_logs.flush()
    stored = await cast(LogStore, engine.store).get_run_log(run.id)
    assert stored is not None and stored.final and stored.size == 16_000 * 67
    assert len(stored.head.encode()) <= HEAD_BYTES and len(stored.tail.encode()) <= TAIL_BYTES
    answer = await engine.run_logs.run_log(run.id)
    assert answer.text.startswith("row 00000 ") and answer.text.endswith("row 15999 " + "y" * 56 + "\n")
    assert answer.omitted_bytes == stored.size - len(stored.head.encode()) - len(stored.tail.encode()) > 900_000
    assert f"[… {answer.omitted_bytes:,} bytes ({answer.omitted_lines:,} lines) left out" in answer.text


async def test_a_running_runs_log_is_written_while_it_runs_then_final(engines: Callable[..., Engine], clock: ManualClock) -> None:
    go_on = asyncio.Event()

    async def handler(ctx: Any) -> None:
        print("first half")
        await go_on.wait()
        print("second half")

    engine = engines([define_schedule(name="long", cron="0 * * * *", timezone="UTC", handler=handler)])
    await engine.open()
    run = await engine.run_now("long")
    await engine.quiesce(runs=False)
    clock.advance(1)  # the flush interval
    await engine.quiesce(runs=False)
    stored = await cast(LogStore, engine.store).get_run_log(run.id)
    assert stored is not None and stored.head == "first half\n" and not stored.final
    first = await engine.run_logs.run_log(run.id)
    assert first.running and first.text == "first half\n"
    go_on.set()
    await engine.quiesce()
    rest = await engine.run_logs.run_log(run.id, after=first.size)
    assert rest.text == "second half\n" and not rest.running and rest.size == first.size + len("second half\n")
    final = await cast(LogStore, engine.store).get_run_log(run.id)
    assert final is not None and final.final


async def test_a_sync_handler_past_its_deadline_is_captured_until_it_returns(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    release = threading.Event()

    def handler(ctx: Any) -> None:
        print("before the deadline")
        release.wait(30)
        print("after it")

    engine = engines([define_schedule(name="late", cron="0 * * * *", timezone="UTC", handler=handler, max_runtime=5)])
    await engine.open()
    run = await engine.run_now("late")
    await engine.quiesce(runs=False)
    clock.advance(6)
    timed_out = await engine.wait_run(run.id)
    assert timed_out.error_tag == "timeout"
    assert (await engine.run_logs.run_log(run.id)).running  # its thread still writes
    release.set()
    await engine.quiesce()
    answer = await engine.run_logs.run_log(run.id)
    assert answer.text == "before the deadline\nafter it\n" and not answer.running


async def test_an_isolated_handler_is_captured_from_its_process(engines: Callable[..., Engine], tmp_path: Path) -> None:
    source = tmp_path / "iso.cron.py"
    source.write_text(
        "import logging, sys\n"
        "from backend import define_schedule\n"
        "def handler(ctx):\n"
        "    print('<<printed in the child>>')\n"
        "    logging.getLogger('child').info('<<logged in the child>>')\n"
        "    print('<<to stderr>>', file=sys.stderr)\n"
        "iso = define_schedule(name='iso', cron='0 * * * *', timezone='UTC', handler=handler, isolation='process')\n"
    )
    engine = engines(discover(tmp_path))
    await engine.open()
    run = await engine.run_now("iso", wait=True)
    assert run.status == "succeeded", run.error_message
    await engine.run_logs.flush()
    text = (await engine.run_logs.run_log(run.id)).text
    assert markers(text) == {"printed in the child", "logged in the child", "to stderr"}
    assert re.search(r"Z INFO child: <<logged in the child>>", text)
    # Nothing but the handler's: its start once said a RuntimeWarning of runpy's first.
    assert [line for line in text.splitlines() if "<<" not in line] == []


async def test_job_attempts_have_a_log_each(engines: Callable[..., Engine], clock: ManualClock) -> None:
    async def deliver(job: Any) -> None:
        print(f"<<attempt {job.attempt}>>")
        if job.attempt == 1:
            raise ConnectionError("smtp down")

    engine = engines([define_queue(name="mail", handler=deliver, attempts=3)])
    await engine.start()
    sent = await engine.jobs.send("mail", {"to": "ops"})
    await engine.quiesce()
    clock.advance(11)  # the retry's backoff
    await engine.quiesce()
    newest = await engine.run_logs.job_log(sent.id)
    assert (newest.attempt, newest.status, newest.text, newest.name) == (2, "succeeded", "<<attempt 2>>\n", "mail")
    first = await engine.run_logs.job_log(sent.id, 1)
    assert first.status == "failed" and first.text.startswith("<<attempt 1>>\n") and "ConnectionError: smtp down" in first.text
    with pytest.raises(NotFound, match="has no attempt 3"):
        await engine.run_logs.job_log(sent.id, 3)
    with pytest.raises(NotFound):
        await engine.run_logs.job_log(NOT_AN_ID)


async def test_every_attempt_of_a_job_retried_from_dead_keeps_a_log_of_its_own(
    engines: Callable[..., Engine], clock: ManualClock
) -> None:
    """An operator's retry of a dead job numbers its attempts from 1 again: ``jobs show``
    listed attempts 1, 2, 1, 2, and attempt 1's log was the newest round's, the first
    round's out of reach though stored (outside attack: the operator's incident, end to
    end). Attempts are numbered on across the retries, each log reached by its number."""
    rounds = [1]

    async def deliver(job: Any) -> None:
        print(f"<<round {rounds[0]} attempt {job.attempt}>>")
        raise ConnectionError("smtp down")

    engine = engines([define_queue(name="mail", handler=deliver, attempts=2)])
    await engine.start()
    sent = await engine.jobs.send("mail", {"to": "ops"})
    await engine.quiesce()
    clock.advance(11)  # the retry's backoff: attempt 2 fails too, the job is dead
    await engine.quiesce()
    rounds[0] = 2
    await engine.jobs.retry("mail", sent.id)
    await engine.quiesce()
    clock.advance(11)
    await engine.quiesce()
    detail = await engine.jobs.get_job(sent.id)
    assert detail.job is not None and detail.job.status == "dead"
    assert [(a.number, a.round, a.attempt) for a in detail.attempts] == [(1, 1, 1), (2, 1, 2), (3, 2, 1), (4, 2, 2)]
    assert [(a["number"], a["round"], a["attempt"]) for a in detail.to_json()["attempts"]] == [
        (1, 1, 1), (2, 1, 2), (3, 2, 1), (4, 2, 2)]  # fmt: skip
    assert "seq" not in detail.to_json()["attempts"][0]
    shown = [line.split("  ")[0] for line in detail_text(detail, clock.now()).splitlines()[-4:]]
    assert shown == ["1 (round 1: 1)", "2 (round 1: 2)", "3 (round 2: 1)", "4 (round 2: 2)"]  # what --attempt takes, first
    for number, said in ((1, "round 1 attempt 1"), (2, "round 1 attempt 2"), (3, "round 2 attempt 1"), (4, "round 2 attempt 2")):
        log = await engine.run_logs.job_log(sent.id, number)
        assert (log.attempt, log.status, markers(log.text)) == (number, "failed", {said})
    newest = await engine.run_logs.job_log(sent.id)
    assert (newest.attempt, markers(newest.text)) == (4, {"round 2 attempt 2"})
    with pytest.raises(NotFound, match=r"has no attempt 5 \(its attempts are numbered 1 to 4\)"):
        await engine.run_logs.job_log(sent.id, 5)


async def test_logs_are_pruned_with_their_runs_and_job_attempts(engines: Callable[..., Engine], clock: ManualClock) -> None:
    hold = asyncio.Event()

    async def handler(ctx: Any) -> None:
        print(f"<<{ctx.name}>>")
        if ctx.name == "held":
            await hold.wait()

    async def deliver(job: Any) -> None:
        print("<<job>>")

    engine = engines([
        define_schedule(name="done", cron="0 * * * *", timezone="UTC", handler=handler),
        define_schedule(name="held", cron="0 * * * *", timezone="UTC", handler=handler),
        define_queue(name="mail", handler=deliver),
    ])  # fmt: skip
    await engine.start()
    done = await engine.run_now("done", wait=True)
    sent = await engine.jobs.send("mail", None)
    await engine.quiesce()
    held = await engine.run_now("held")
    await engine.quiesce(runs=False)
    clock.advance(2)
    await engine.quiesce(runs=False)
    store: Any = engine.store
    assert await store.get_run_log(done.id) and await store.get_run_log(held.id) and await store.get_job_log(sent.id)
    later = clock.now() + timedelta(days=1)
    await store.prune_runs(later)
    assert await store.get_run_log(done.id) is None
    assert await store.get_run_log(held.id) is not None  # still running: kept, as its run is
    await store.prune_jobs(later, later, later)
    assert await store.get_job_log(sent.id) is None
    hold.set()


async def test_a_final_log_is_never_replaced(url: str, clock: ManualClock) -> None:
    store: Any = open_store(url)
    await store.open()
    try:
        target = LogTarget("run", NOT_AN_ID)
        at = clock.now()
        await store.save_logs([StoredLog(target, "a\n", "", 2, 0, 0, False, at)])
        await store.save_logs([StoredLog(target, "a\nb\n", "", 4, 0, 0, True, at)])
        await store.save_logs([StoredLog(target, "a\n", "", 2, 0, 0, False, at)])  # a late, older write
        stored = await store.get_run_log(NOT_AN_ID)
        assert (stored.head, stored.final) == ("a\nb\n", True)
        await store.save_logs([StoredLog(LogTarget("job", NOT_AN_ID, 1, 1), "one\n", "", 4, 0, 0, True, at),
                               StoredLog(LogTarget("job", NOT_AN_ID, 2, 1), "again\n", "", 6, 0, 0, True, at),
                               StoredLog(LogTarget("job", NOT_AN_ID, 3, 2), "two\n", "", 4, 0, 0, False, at)])
        assert (await store.get_job_log(NOT_AN_ID)).head == "two\n"
        assert (await store.get_job_log(NOT_AN_ID, 1)).head == "one\n"  # by claim: its attempt number repeats
        assert (await store.get_job_log(NOT_AN_ID, 2)).head == "again\n"
        assert await store.get_job_log(NOT_AN_ID, 4) is None
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------
# reading: the actions, over HTTP, remote
# ---------------------------------------------------------------------------------------
async def test_the_log_actions_over_http_and_the_remote_backend(engines: Callable[..., Engine]) -> None:
    async def handler(ctx: Any) -> None:
        print("one\x1b[31m red\x1b[0m")
        print("two")

    async def deliver(job: Any) -> None:
        print("<<job line>>")

    async def flow(ctx: Any, input: Any) -> Any:
        ctx.log("<<noted>>")
        return await ctx.step("s", lambda: 1)

    engine = engines([
        define_schedule(name="talks", cron="0 * * * *", timezone="UTC", handler=handler),
        define_queue(name="mail", handler=deliver),
        define_durable(name="flow", handler=flow),
    ])  # fmt: skip
    await engine.start()
    run = await engine.run_now("talks", wait=True)
    sent = await engine.jobs.send("mail", None)
    started = await engine.durable.start_execution("flow", None)
    await engine.quiesce()
    embedded = EmbeddedBackend(engine)
    app = create_app(embedded, token=TOKEN)
    headers = {"authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=headers) as http:
        body = (await http.get(f"/inspect/runs/{run.id}/log")).json()
        assert body["text"] == "one\\x1b[31m red\\x1b[0m\ntwo\n"  # an escape sequence never reaches a terminal
        assert body["size"] == len("one\x1b[31m red\x1b[0m\ntwo\n") and body["running"] is False
        assert (body["kind"], body["id"], body["name"], body["status"]) == ("run", run.id, "talks", "succeeded")
        rest = (await http.get(f"/inspect/runs/{run.id}/log", params={"after": body["size"] - 4})).json()
        assert rest["text"] == "two\n"
        for path in (f"/inspect/runs/{NOT_AN_ID}/log", "/inspect/runs/not-an-id/log", f"/inspect/jobs/{NOT_AN_ID}/log",
                     f"/inspect/durable/executions/{NOT_AN_ID}/log"):  # fmt: skip
            answer = await http.get(path)
            assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found", path
        bad = await http.get(f"/inspect/runs/{run.id}/log", params={"after": "-3"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "after"
        job = (await http.get(f"/inspect/jobs/{sent.id}/log", params={"attempt": 1})).json()
        assert job["text"] == "<<job line>>\n" and job["attempt"] == 1
        execution = (await http.get(f"/inspect/durable/executions/{started.id}/log")).json()
        assert "<<noted>>" in execution["text"] and execution["running"] is False
    remote = RemoteBackend("http://t", TOKEN, transport=httpx.ASGITransport(app=app))
    await remote.connect()
    try:
        assert await remote.run_log(run.id) == await embedded.run_log(run.id)
        assert await remote.job_log(sent.id) == await embedded.job_log(sent.id)
        assert (await remote.execution_log(started.id)).text == (await embedded.execution_log(started.id)).text
        with pytest.raises(NotFound):
            await remote.run_log(NOT_AN_ID)
        with pytest.raises(BadInput):
            await remote.job_log(sent.id, attempt=0)
    finally:
        await remote.close()


class _Refusing(io.TextIOBase):
    """A process stream whose reader left (``serve | head -1``) or whose disk is full."""

    name = "<stdout>"

    def __init__(self, error: OSError) -> None:
        self.error = error
        self.buffer = self  # (its binary layer refuses alike)

    def write(self, text: Any) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error


@pytest.mark.parametrize("error", [BrokenPipeError(32, "Broken pipe"), OSError(28, "No space left on device")])
async def test_a_print_the_processs_stream_refuses_fails_no_run(
    engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, error: OSError
) -> None:
    """Found by an outside attack (2 of 2): every run of a printing schedule failed with
    BrokenPipeError under ``serve | head -1`` with PYTHONUNBUFFERED, and a run that happened
    to flush a full disk's buffer failed with ENOSPC: the copy to the stream failed the work."""

    async def printing(ctx: Any) -> None:
        print("<<async>>", flush=True)

    def printing_sync(ctx: Any) -> None:
        print("<<sync>>")
        sys.stdout.flush()
        sys.stdout.buffer.write(b"<<bytes>>\n")

    engine = engines([define_schedule(name="a", cron="0 * * * *", timezone="UTC", handler=printing),
                      define_schedule(name="s", cron="0 * * * *", timezone="UTC", handler=printing_sync)])  # fmt: skip
    await engine.open()
    monkeypatch.setattr(sys, "stdout", _Refusing(error))
    runs = [await engine.run_now(name, wait=True) for name in ("a", "s", "a")]
    monkeypatch.undo()
    assert [(r.status, r.error_message) for r in runs] == [("succeeded", None)] * 3
    await engine.run_logs.flush()
    # The warning goes to the process's log, never into the run's (it was spliced into the
    # print's line, between its text and its newline).
    assert (await engine.run_logs.run_log(runs[0].id)).text == "<<async>>\n"
    assert (await engine.run_logs.run_log(runs[1].id)).text == "<<sync>>\n<<bytes>>\n"
    said = [r.getMessage() for r in caplog.records if "could not reach stdout" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"a handler's print could not reach stdout ({type(error).__name__}")


async def test_output_of_a_thread_that_outlives_its_handler_is_said_lost_once_in_the_process_log(
    engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """A thread the handler started and left running prints after the run ended: its
    lines cannot join a log that was written and closed, and the log said nothing of them
    (found by an outside attack). The process's log says so, once, naming the run."""
    gate, printed = threading.Event(), threading.Event()

    def lingering() -> None:
        gate.wait(10)
        print("late 1")
        print("late 2")
        printed.set()

    def leaves_a_thread(ctx: Any) -> None:
        threading.Thread(target=lingering, daemon=True).start()  # (its output is the run's while the run lasts)
        print("early")

    engine = engines([define_schedule(name="t", cron="0 * * * *", timezone="UTC", handler=leaves_a_thread)])
    await engine.open()
    run = await engine.run_now("t", wait=True)
    await engine.run_logs.flush()
    gate.set()
    assert await asyncio.to_thread(printed.wait, 10)
    await engine.run_logs.flush()
    assert (await engine.run_logs.run_log(run.id)).text == "early\n"
    said = [r.getMessage() for r in caplog.records if "output written after it ended" in r.getMessage()]
    assert said == [f"run {run.id}: output written after it ended (by a thread it left running?) is not kept in its log; "
                    "it reaches the process's output only"]  # fmt: skip


async def test_the_log_writer_started_by_a_runs_first_print_is_no_part_of_that_run(
    engines: Callable[..., Engine], clock: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer of the logs is started by the first run that prints. It kept that run's
    context for good, capture included: its warning during a store outage minutes later
    was said to be that run's late output (``run <id>: output written after it ended``),
    blaming a run long finished, in an incident's log (outside attack: the operator's
    incident, end to end)."""

    def talks(ctx: Any) -> None:
        print(f"<<{ctx.name}>>")

    engine = engines([define_schedule(name="first", cron="0 * * * *", timezone="UTC", handler=talks),
                      define_schedule(name="later", cron="0 * * * *", timezone="UTC", handler=talks)])  # fmt: skip
    await engine.open()
    first = await engine.run_now("first", wait=True)  # its print starts the writer
    await engine.run_logs.flush()

    async def cut(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("the store is away (test)")

    monkeypatch.setattr(engine.store, "save_logs", cut)
    later = await engine.run_now("later", wait=True)
    clock.advance(1)  # past the batch's pause: the writer tries, and says it cannot
    await engine.quiesce(runs=False)
    said = [r.getMessage() for r in caplog.records]
    assert "run logs: cannot write them now (the store is away (test)); kept in memory and retried" in said
    assert not [line for line in said if "output written after it ended" in line], said
    assert first.id not in "".join(said)
    assert later.status == "succeeded"
