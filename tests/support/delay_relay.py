#!/usr/bin/env python3
"""A TCP relay that holds each direction's bytes for a fixed delay before passing them on: the
latency of a real link, for the benches' shaped link (tests/support/shaped_link.rs) on a kernel
without sch_netem. Bytes keep their order and flow control (a slow reader slows the sender);
the delay is added once per direction, so a request and its answer take 2 x DELAY more, as over
a link with that one-way delay. What it does not model: the TCP handshake (the relay accepts
at once; its connection upstream waits DELAY) and TCP's slow start over the longer round trip.

Usage: delay_relay.py LISTEN_ADDR LISTEN_PORT UPSTREAM_ADDR UPSTREAM_PORT DELAY_MS READY_FILE
"""

import asyncio
import sys

# What one direction may hold while it waits out the delay: at 100 Mbit/s, 20 ms is 250 kB.
HELD = 8 << 20


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()
    held = asyncio.Semaphore(HELD >> 16)

    async def receive():
        try:
            while True:
                await held.acquire()
                data = await reader.read(1 << 16)
                await queue.put((loop.time() + delay, data))
                if not data:
                    return
        finally:
            # A reset ends the direction as an end of stream would.
            queue.put_nowait((loop.time() + delay, b""))

    async def send():
        while True:
            due, data = await queue.get()
            pause = due - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            held.release()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    receiving = asyncio.ensure_future(receive())
    try:
        await send()
    finally:
        receiving.cancel()


async def main():
    listen, port, upstream, upstream_port, delay_ms, ready = sys.argv[1:7]
    delay = int(delay_ms) / 1000

    async def handle(client_reader, client_writer):
        await asyncio.sleep(delay)
        try:
            up_reader, up_writer = await asyncio.open_connection(upstream, int(upstream_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, up_writer, delay),
                             pump(up_reader, client_writer, delay),
                             return_exceptions=True)
        client_writer.close()
        up_writer.close()

    server = await asyncio.start_server(handle, listen, int(port), backlog=128)
    with open(ready, "w") as f:
        f.write("ready\n")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
