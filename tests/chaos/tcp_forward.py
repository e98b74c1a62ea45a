"""A TCP forwarder run by the ownership test in the root network namespace: accepts on
each ``HOST:PORT`` given and relays to ``--to HOST:PORT`` (PostgreSQL on loopback), so
workers in other namespaces reach it over their veth without a change to the server's
configuration. A connection closed on one side is closed on the other (a killed
worker's session ends at once). Prints ``ready`` once it listens.

    python -m tests.chaos.tcp_forward 10.9.0.1:5432 10.9.0.5:5432 --to 127.0.0.1:5432
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def main(listen: list[str], target: str) -> None:
    host, port = target.rsplit(":", 1)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    servers = []
    for address in listen:
        bind, bind_port = address.rsplit(":", 1)
        servers.append(await asyncio.start_server(relay, bind, int(bind_port), reuse_address=True))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("listen", nargs="+")
    parser.add_argument("--to", default="127.0.0.1:5432")
    args = parser.parse_args()
    asyncio.run(main(args.listen, args.to))
