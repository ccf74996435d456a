"""A TCP proxy that holds every chunk D ms in each direction: a slow network on one machine.

The kernel here has no netem, so the ``network`` workload (bench/network.py) puts this between
every process and Redis. Each accepted connection gets its own connection to the target; each
direction is a reader that stamps a chunk with the time it may leave (arrival + D) and a writer
that sends chunks in arrival order once they are due. The two directions never wait for each
other, and a chunk is never reordered within its direction.

Run as its own process (``python -m bench.netproxy --target-port P``), so the proxy's loop
never shares a GIL with the dispatcher it delays. It prints ``listening <port>`` when ready
and reads commands on stdin, one per line, each answered by one line on stdout:

- ``delay <ms>``: chunks read from now on wait <ms> (answer ``delay <ms>``);
- ``conns``: a JSON object {the proxy's port towards the target: the client's port}, so a
  ``MONITOR`` line (which shows the former) can be traced to the process that sent it.

Timers: asyncio's default selector (epoll) sleeps in whole milliseconds, which would turn a
0.5 ms delay into 1 ms; the loop here runs on ``select()``, whose timeout has microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["DelayProxy", "delay_proxy", "main"]

CHUNK_BYTES = 65536
READY_TIMEOUT_S = 10.0
# An answer to a control line comes from an idle loop at once; this bounds a wedged proxy.
CONTROL_TIMEOUT_S = 10.0


class _Relay:
    """The proxy's state: the current delay and the live connections."""

    def __init__(self, target_host: str, target_port: int, delay_s: float) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        # the proxy's local port towards the target -> the client's port
        self.conns: dict[int, int] = {}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        up_port = up_writer.get_extra_info("sockname")[1]
        self.conns[up_port] = writer.get_extra_info("peername")[1]
        try:
            await asyncio.gather(
                self._direction(reader, up_writer), self._direction(up_reader, writer)
            )
        finally:
            self.conns.pop(up_port, None)
            for w in (writer, up_writer):
                w.close()

    async def _direction(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one direction: every chunk leaves ``delay_s`` after it arrived, in order."""
        loop = asyncio.get_running_loop()
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                when, chunk = await due.get()
                wait_s = when - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                if not chunk:  # the sender closed its side: pass the close on, in order
                    with suppress(OSError):
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                due.put_nowait((loop.time() + self.delay_s, chunk))
                if not chunk:
                    break
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()
            with suppress(asyncio.CancelledError, ConnectionError, OSError):
                await sender

    async def control(self) -> None:
        """Answer the control lines read from stdin until it closes."""
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            words = line.split()
            if words[:1] == ["delay"] and len(words) == 2:
                self.delay_s = float(words[1]) / 1000
                answer = f"delay {words[1]}"
            elif words == ["conns"]:
                answer = json.dumps(self.conns)
            else:
                answer = f"error: unknown command {line.strip()!r}; use 'delay <ms>' or 'conns'"
            print(answer, flush=True)


async def _main(args: argparse.Namespace) -> None:
    relay = _Relay(args.target_host, args.target_port, args.delay_ms / 1000)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", args.port)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    await relay.control()  # the bench closing stdin is the proxy's end
    server.close()
    # Whatever connections are left (and the thread reading stdin) end with the process, now:
    # waiting for their peers to hang up would let a forgotten client keep the proxy alive.
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.netproxy", description=__doc__)
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="each way")
    args = parser.parse_args(argv)
    # select(): sub-millisecond timers (see the module docstring).
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(_main(args))
    finally:
        loop.close()


class DelayProxy:
    """The bench's handle on a running proxy process: its port, its delay, its connections."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.port = port

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _ask(self, line: str) -> str:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(line + "\n")
        stdin.flush()
        answer = _read_line(self.proc, CONTROL_TIMEOUT_S)
        if answer.startswith("error"):
            raise RuntimeError(f"bench.netproxy: {answer}")
        return answer

    def set_delay(self, delay_ms: float) -> None:
        """Chunks read from now on wait ``delay_ms`` in each direction."""
        self._ask(f"delay {delay_ms:g}")

    def connections(self) -> dict[int, int]:
        """{the proxy's port towards Redis: the client's port} of every open connection."""
        return {int(k): v for k, v in json.loads(self._ask("conns")).items()}


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    stdout = proc.stdout
    assert stdout is not None
    ready = selectors.DefaultSelector()
    ready.register(stdout, selectors.EVENT_READ)
    try:
        if not ready.select(timeout_s):
            raise RuntimeError(f"bench.netproxy (pid {proc.pid}) did not answer in {timeout_s:g}s")
    finally:
        ready.close()
    line = stdout.readline()
    if not line:
        raise RuntimeError(f"bench.netproxy (pid {proc.pid}) exited: {proc.poll()}")
    return line.strip()


@contextmanager
def delay_proxy(target_port: int, delay_ms: float = 0.0) -> Iterator[DelayProxy]:
    """A proxy process towards 127.0.0.1:``target_port``, stopped (by PID) on exit."""
    argv = [sys.executable, "-m", "bench.netproxy", "--target-port", str(target_port)]
    proc = subprocess.Popen(
        [*argv, "--delay-ms", str(delay_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    try:
        first = _read_line(proc, READY_TIMEOUT_S)
        if not first.startswith("listening "):
            raise RuntimeError(f"bench.netproxy did not start: {first!r}")
        yield DelayProxy(proc, int(first.split()[1]))
    finally:
        if proc.stdin is not None:
            with suppress(OSError):
                proc.stdin.close()  # the proxy's end
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


if __name__ == "__main__":
    main()
