#!/usr/bin/env python3
"""Load time and memory of models through the daemon: copy into the sealed weights segment, worker start.

Starts build/bin/inferd on a private socket, loads each model 3 times (unloading in between) and prints the
wall time of load(), the daemon's own loadMs, the segment size and copy rate, and the resident memory of the
daemon and the worker (RssAnon; RssShmem = weight pages the worker has touched).

Usage: bench_load.py MODEL.gguf [MODEL.gguf ...]
"""
import asyncio
import os
import sys
import time

import capnp

from common import running_daemon

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
api = capnp.load(os.path.join(ROOT, "schemas", "inferd.capnp"), imports=["/usr/include"])


async def main(sock, models):
    s = await capnp.AsyncIoStream.create_unix_connection(sock)
    c = capnp.TwoPartyClient(s)
    d = c.bootstrap().cast_as(api.Daemon)
    admin = (await d.admin()).admin
    for m in models:
        for _ in range(3):
            t = time.perf_counter()
            r = (await admin.load(os.path.abspath(m), {"id": "x"})).model
            wall = (time.perf_counter() - t) * 1000
            st = (await admin.status()).status
            w = st.models[0].info.workers[0]
            print(f"{os.path.basename(m)}: load {wall:.0f} ms (daemon loadMs {r.loadMs:.0f}), segment "
                  f"{r.weightsBytes / 2**20:.1f} MiB, {r.weightsBytes / 2**30 / (r.loadMs / 1000):.2f} GiB/s copy; "
                  f"daemon RssAnon {st.rssBytes / 2**20:.1f} MiB, worker RssAnon {w.rssBytes / 2**20:.1f} MiB, "
                  f"RssShmem {w.sharedBytes / 2**20:.1f} MiB")
            await admin.unload("x")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with running_daemon(os.path.join(ROOT, "build"), prefix="inferd-load-") as (_, sock):
        asyncio.run(capnp.run(main(sock, sys.argv[1:])))
