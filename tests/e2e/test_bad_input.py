#!/usr/bin/env python3
"""End-to-end: bad input never hurts the daemon. Bad model files and paths, unknown ids, invalid
sampling values, prompts longer than the context, token ids outside the vocabulary, a client that
vanishes mid-stream, garbage and oversized frames on the socket, a protocol version mismatch: each
gets a clear error of the right type, and a generate right after still works.

    test_bad_input.py --bin-dir BUILD/bin --model MODEL.gguf
"""
import asyncio
import csv
import math
import os
import random
import socket
import struct
import time

import harness
from harness import Connection, request, run_async

GOOD = "good"      # loaded once for the class: the model that must keep working
SHORT = "short"    # context 64
CORRUPT_DIR = os.path.join(harness.SOURCE_DIR, "tests", "data", "corrupt")
CORRUPT_PICKS = ["bad_magic.gguf", "huge_tensor_count.gguf", "offset_past_end.gguf", "nested_array_bomb.gguf"]
SOCKET_EOF_TIMEOUT_S = 10


def corrupt_manifest():
    """file name -> the message substring tests/data/corrupt/MANIFEST.tsv expects."""
    out = {}
    with open(os.path.join(CORRUPT_DIR, "MANIFEST.tsv")) as f:
        for row in csv.reader((line for line in f if not line.startswith("#")), delimiter="\t"):
            if len(row) >= 3:
                out[row[0]] = row[2]
    return out


class BadInputTest(harness.DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = harness.Daemon().start()

        async def load():
            conn = await Connection.open(cls.daemon.socket_path)
            await conn.load(harness.Config.model, id=GOOD, parallel=2, contextSize=256)
            await conn.load(harness.Config.model, id=SHORT, parallel=1, contextSize=64)
            conn.close()

        try:
            run_async(load(), daemons=[cls.daemon])
        except BaseException:
            cls.daemon.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.daemon.stop(remove_dir=False)
        # After all the abuse the daemon still stops cleanly.
        assert rc == 0, f"inferd exited with {rc} on SIGTERM after the bad-input tests\n{cls.daemon.log_tail()}"
        cls.daemon.stop()

    def run_test(self, coro):
        run_async(coro, daemons=[self.daemon])

    async def connect(self):
        return await Connection.open(self.daemon.socket_path)

    async def assert_still_serves(self, conn, context):
        self.assertIsNone(self.daemon.proc.poll(), f"{context}: the daemon died\n{self.daemon.log_tail()}")
        out = await conn.generate(request(GOOD, "The capital of France is", max_tokens=3, ignoreEog=True))
        self.assertCompleted(out, f"generate right after {context}")
        self.assertEqual(out.result.generatedTokens, 3, f"generate right after {context}: {out}")

    # ---------------------------------------------------------------------------------------------
    # Model files and paths

    def test_load_missing_file(self):
        async def body():
            conn = await self.connect()
            path = os.path.join(self.daemon.dir, "no-such-dir", "model.gguf")
            await self.expect_error(conn.load(path, id="missing"), "FAILED", path, context="load of a missing file")
            self.assertNotIn("missing", [m.id for m in await conn.list()], "a failed load left a model behind")
            await self.assert_still_serves(conn, "loading a missing file")
            conn.close()

        self.run_test(body())

    def test_load_non_gguf_file(self):
        async def body():
            conn = await self.connect()
            readme = os.path.join(harness.SOURCE_DIR, "README.md")
            e = await self.expect_error(conn.load(readme, id="readme"), "FAILED", context="load of README.md")
            self.assertTrue("gguf" in e.description.lower() or "magic" in e.description.lower(),
                            f"the error should say the file is not GGUF: {e.description}")
            # The error never quotes the file: a client must not learn what a file it names starts with.
            self.assertNotIn("# inferd", e.description, "the error quotes the file's first bytes")
            self.assertNotIn("# inf", e.description, "the error quotes the file's first bytes")
            await self.assert_still_serves(conn, "loading README.md")
            conn.close()

        self.run_test(body())

    # A FIFO (or a device) as the model path: refused as not a regular file before anything is read, at
    # once (opened without waiting for a writer); the daemon keeps serving, and a second try is the same.
    def test_load_fifo_is_refused_without_blocking(self):
        fifo = os.path.join(self.daemon.dir, "model-fifo.gguf")
        os.mkfifo(fifo)
        self.addCleanup(os.unlink, fifo)

        async def body():
            conn = await self.connect()
            for attempt in range(2):
                start = time.monotonic()
                await self.expect_error(asyncio.wait_for(conn.load(fifo, id="fifo"), 10), "FAILED",
                                        "not a regular file", context=f"load of a FIFO, attempt {attempt + 1}")
                self.assertLess(time.monotonic() - start, 5.0, "loading a FIFO blocked")
            self.assertNotIn("fifo", [m.id for m in await conn.list()], "a failed load left a model behind")
            await self.assert_still_serves(conn, "loading a FIFO")
            conn.close()

        self.run_test(body())

    # Tokenizing runs off the supervisor thread: while one client tokenizes the largest text the limit
    # allows (4 MiB by default, ~1 s here), another's status is answered first; a text over the limit is
    # refused, naming the limit, before anything is tokenized; so is a prompt over it.
    def test_large_texts_neither_stall_the_daemon_nor_pass_the_limit(self):
        limit = 4 << 20
        words = "the quick brown fox jumps over the lazy dog "
        text = (words * (limit // len(words) + 1))[:limit]

        async def body():
            conn = await self.connect()
            other = await self.connect()
            tokenize = asyncio.ensure_future(conn.tokenize(GOOD, text))
            status = asyncio.ensure_future(other.status())
            done, _ = await asyncio.wait({tokenize, status}, return_when=asyncio.FIRST_COMPLETED)
            self.assertIn(status, done, "status waited for another client's tokenization")
            self.assertGreater(len(await tokenize), len(text) // 8)
            await self.expect_error(conn.tokenize(GOOD, text + "x"), "FAILED", "max-text-bytes",
                                    context="tokenize of a text over the limit")
            out = await conn.generate(request(GOOD, text + "x", max_tokens=1))
            self.assertKjError(out.error, "FAILED", "max-text-bytes", context="a prompt over the limit")
            await self.assert_still_serves(conn, "large texts")
            conn.close()
            other.close()

        self.run_test(body())

    def test_load_corrupt_gguf(self):
        expected = corrupt_manifest()

        async def body():
            conn = await self.connect()
            for name in CORRUPT_PICKS:
                with self.subTest(file=name):
                    path = os.path.join(CORRUPT_DIR, name)
                    await self.expect_error(conn.load(path, id="corrupt"), "FAILED", expected[name],
                                            context=f"load of {name}")
                    self.assertNotIn("corrupt", [m.id for m in await conn.list()])
                    await self.assert_still_serves(conn, f"loading {name}")
            conn.close()

        self.run_test(body())

    def test_load_model_larger_than_memory(self):
        # A valid GGUF (one F32 tensor) 1 GiB larger than MemAvailable, sparse on disk: the weights copy
        # would be resident, so the load is refused up front instead of the OOM killer ending the daemon.
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        elements = (available + (1 << 30)) // 4
        head = (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"w" +
                struct.pack("<IQIQ", 1, elements, 0, 0))
        head += b"\0" * (-len(head) % 32)
        path = os.path.join(self.daemon.dir, "larger-than-memory.gguf")
        try:
            with open(path, "wb") as f:
                f.write(head)
                f.truncate(len(head) + 4 * elements)
        except OSError as e:
            if os.path.exists(path):
                os.unlink(path)
            self.skipTest(f"the file system does not take a sparse file of {4 * elements >> 20} MiB: {e}")

        async def body():
            conn = await self.connect()
            await self.expect_error(conn.load(path, id="huge"), "FAILED", "MemAvailable", "shared memory",
                                    context="load of a model larger than the available memory")
            self.assertNotIn("huge", [m.id for m in await conn.list()], "a failed load left a model behind")
            await self.assert_still_serves(conn, "loading a model larger than memory")
            conn.close()

        try:
            self.run_test(body())
        finally:
            os.unlink(path)

    def test_load_relative_path_and_bad_options(self):
        async def body():
            conn = await self.connect()
            relative = os.path.relpath(harness.Config.model, harness.SOURCE_DIR)
            await self.expect_error(conn.load(relative, id="rel"), "FAILED", "absolute", relative,
                                    context="load of a relative path")
            cases = [
                ({"id": GOOD}, ("already loaded", GOOD)),
                ({"id": "bad id!"}, ("model id",)),
                ({"id": "p", "parallel": 100000}, ("parallel",)),
                ({"id": "c", "contextSize": 8}, ("context size",)),
                ({"id": "b", "backend": "tpu"}, ("backend", "tpu")),
                ({"id": "s", "padStep": 3}, ("pad step",)),
            ]
            for options, fragments in cases:
                with self.subTest(options=options):
                    await self.expect_error(conn.load(harness.Config.model, **options), "FAILED", *fragments,
                                            context=f"load with {options}")
            await self.assert_still_serves(conn, "invalid load options")
            conn.close()

        self.run_test(body())

    # ---------------------------------------------------------------------------------------------
    # Requests

    def test_unknown_model_id(self):
        async def body():
            conn = await self.connect()
            out = await conn.generate(request("no-such-model", "Hello"))
            self.assertKjError(out.error, "FAILED", "no-such-model", context="generate on an unknown model")
            await self.expect_error(conn.tokenize("no-such-model", "Hello"), "FAILED", "no-such-model",
                                    context="tokenize on an unknown model")
            await self.expect_error(conn.detokenize("no-such-model", [1, 2]), "FAILED", "no-such-model",
                                    context="detokenize on an unknown model")
            await self.expect_error(conn.unload("no-such-model"), "FAILED", "no-such-model",
                                    context="unload of an unknown model")
            await self.assert_still_serves(conn, "an unknown model id")
            conn.close()

        self.run_test(body())

    def test_invalid_sampling_values(self):
        cases = [
            ({"temperature": -1.0}, "temperature"),
            ({"temperature": math.nan}, "temperature"),
            ({"temperature": math.inf}, "temperature"),
            ({"temperature": 0.8, "topP": 1.5}, "top"),
            ({"temperature": 0.8, "topP": 0.0}, "top"),
            ({"temperature": 0.8, "topP": math.nan}, "top"),
            ({"temperature": 0.8, "minP": 1.0}, "min"),
            ({"temperature": 0.8, "repeatPenalty": 0.0}, "repeat"),
            ({"temperature": 0.8, "frequencyPenalty": 3.0}, "frequency"),
            ({"temperature": 0.8, "presencePenalty": -2.5}, "presence"),
        ]

        async def body():
            conn = await self.connect()
            for sampling, field in cases:
                with self.subTest(sampling=sampling):
                    r = request(GOOD, "Hello", max_tokens=4)
                    r["sampling"] = sampling
                    out = await conn.generate(r)
                    self.assertKjError(out.error, "FAILED", field, context=f"sampling {sampling}")
                    self.assertEqual(out.tokens, [], "a refused request streamed tokens")
            for interval in (-2, 60001):
                with self.subTest(stream_interval=interval):
                    r = request(GOOD, "Hello", max_tokens=4)
                    r["streamIntervalMs"] = interval
                    out = await conn.generate(r)
                    self.assertKjError(out.error, "FAILED", "streamIntervalMs", context=f"streamIntervalMs {interval}")
                    self.assertEqual(out.tokens, [], "a refused request streamed tokens")
            await self.assert_still_serves(conn, "invalid sampling values")
            conn.close()

        self.run_test(body())

    def test_invalid_request_shapes(self):
        async def body():
            conn = await self.connect()
            cases = [
                (request(GOOD, ""), ("empty",)),
                (request(GOOD, messages=[]), ("at least one message",)),
                (request(GOOD, messages=[{"role": "wizard", "content": "hi"}]), ("role", "wizard")),
                (request(GOOD, "Hello", stop=[f"s{i}" for i in range(17)]), ("stop strings",)),
                (request(GOOD, "Hello", stop=["x" * 300]), ("stop string",)),
            ]
            for r, fragments in cases:
                with self.subTest(request=str(r)[:80]):
                    out = await conn.generate(r)
                    self.assertKjError(out.error, "FAILED", *fragments, context=f"request {str(r)[:80]}")
            await self.assert_still_serves(conn, "malformed requests")
            conn.close()

        self.run_test(body())

    def test_prompt_longer_than_context(self):
        async def body():
            conn = await self.connect()
            long_prompt = "one two three four five six seven eight nine ten " * 20
            n_prompt = len(await conn.tokenize(SHORT, long_prompt, True, True))
            self.assertGreater(n_prompt, 64)
            out = await conn.generate(request(SHORT, long_prompt, max_tokens=4))
            self.assertKjError(out.error, "FAILED", "context", str(n_prompt), "64",
                               context=f"a {n_prompt}-token prompt on a 64-token context")
            self.assertEqual(out.tokens, [], "an over-long prompt streamed tokens (silently truncated?)")
            # Token input: the same rule.
            out = await conn.generate(request(SHORT, tokens=[1] * 64, max_tokens=4))
            self.assertKjError(out.error, "FAILED", "context", context="64 prompt tokens on a 64-token context")
            # A prompt that fits but leaves less room than maxTokens ends at the context, and says so.
            fitting = await conn.tokenize(SHORT, "one two three four five six seven eight nine ten " * 5, True, True)
            self.assertLess(len(fitting), 64)
            out = await conn.generate(request(SHORT, tokens=fitting, max_tokens=200, ignoreEog=True))
            self.assertCompleted(out, "prompt + maxTokens past the context")
            self.assertEqual(out.result.finishReason, "contextFull", f"{out}")
            self.assertEqual(out.result.promptTokens + out.result.generatedTokens, 64, f"{out}")
            await self.assert_still_serves(conn, "prompts longer than the context")
            conn.close()

        self.run_test(body())

    def test_token_ids_outside_vocabulary(self):
        async def body():
            conn = await self.connect()
            for tokens in ([1, 49152], [-1], [2 ** 31 - 1], [5, 6, -2147483648]):
                with self.subTest(tokens=tokens):
                    bad = next(t for t in tokens if t < 0 or t >= 49152)
                    out = await conn.generate(request(GOOD, tokens=tokens, max_tokens=2))
                    self.assertKjError(out.error, "FAILED", "vocabulary", str(bad),
                                       context=f"generate with tokens {tokens}")
                    await self.expect_error(conn.detokenize(GOOD, tokens), "FAILED", "vocabulary",
                                            context=f"detokenize {tokens}")
            await self.assert_still_serves(conn, "token ids outside the vocabulary")
            conn.close()

        self.run_test(body())

    def test_client_disconnects_mid_stream(self):
        async def body():
            watcher = await self.connect()
            for model_id in (GOOD, SHORT):  # a running request, and (on SHORT, 1 slot) a queued one too
                leaver = await self.connect()

                async def leave(sink):
                    if len(sink.tokens) >= 3:
                        leaver.close()

                running = leaver.start_generate(request(model_id, "Once upon a time", max_tokens=40, ignoreEog=True),
                                                leave)
                queued = leaver.start_generate(request(model_id, "Hello", max_tokens=40, ignoreEog=True)) \
                    if model_id == SHORT else None
                out = await running
                self.assertIsNotNone(out.error, f"the generate survived closing its connection: {out}")
                if queued is not None:
                    self.assertIsNotNone((await queued).error)

                async def idle():
                    m = await watcher.model_status(model_id)
                    return (m.slotsUsed, m.requestsActive, m.requestsQueued) == (0, 0, 0)

                await harness.wait_until_async(idle, 10, f"{model_id}: the abandoned requests to free their slots")
            self.assertIn("cancelled by the client", self.daemon.log())
            await self.assert_still_serves(watcher, "a client that disconnected mid-stream")
            watcher.close()

        self.run_test(body())

    def test_protocol_version_mismatch(self):
        async def body():
            conn = await self.connect()
            for version in (0, 2, 2 ** 32 - 1):
                with self.subTest(version=version):
                    await self.expect_error(conn.daemon.hello(version, "from-the-future"), "FAILED",
                                            "protocol version", str(version),
                                            context=f"hello with protocol version {version}")
            hello = await conn.daemon.hello(harness.schema().protocolVersion, "back-to-normal")
            self.assertEqual(hello.protocolVersion, harness.schema().protocolVersion)
            await self.assert_still_serves(conn, "a protocol version mismatch")
            conn.close()

        self.run_test(body())

    # ---------------------------------------------------------------------------------------------
    # Bytes that are not Cap'n Proto

    def raw_exchange(self, payload):
        """Sends `payload` on a fresh raw connection and returns what the daemon answered before it
        closed the connection (it must close it: the input is not a valid message)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(SOCKET_EOF_TIMEOUT_S)
        try:
            s.connect(self.daemon.socket_path)
            try:
                s.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                return b""  # closed while we were still writing: fine
            received = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    return received
                except socket.timeout:
                    self.fail(f"the daemon kept a connection open {SOCKET_EOF_TIMEOUT_S} s after "
                              f"{len(payload)} bytes of non-Cap'n Proto input ({payload[:16].hex()}...)")
                if not chunk:
                    return received
                received += chunk
        finally:
            s.close()

    def test_malformed_bytes_on_the_socket(self):
        rng = random.Random(4242)
        payloads = {
            "random garbage": bytes(rng.getrandbits(8) for _ in range(4096)),
            # Segment table: 2^31 segments.
            "2^31 segments": struct.pack("<I", 0x7FFFFFFF) + b"\0" * 60,
            # One segment claiming 2^32-1 words (32 GiB): must be refused, not allocated or awaited.
            "a 32 GiB segment": struct.pack("<II", 0, 0xFFFFFFFF) + b"\0" * 64,
            # 512 segments of 2^24 words each.
            "512 large segments": struct.pack("<I", 511) + struct.pack("<I", 1 << 24) * 512,
            # A well-framed message whose content is garbage.
            "garbage in a valid frame": struct.pack("<II", 0, 8) + bytes(rng.getrandbits(8) for _ in range(64)),
        }
        for name, payload in payloads.items():
            with self.subTest(payload=name):
                self.raw_exchange(payload)
                self.assertIsNone(self.daemon.proc.poll(), f"the daemon died on {name}\n{self.daemon.log_tail()}")

        async def body():
            conn = await self.connect()
            await self.assert_still_serves(conn, "malformed bytes on the socket")

            async def only_this_connection():
                return (await conn.status()).connections == 1

            await harness.wait_until_async(only_this_connection, 10,
                                           "status().connections to count only this connection (the raw "
                                           "sockets' connections should be gone)")
            conn.close()

        self.run_test(body())


if __name__ == "__main__":
    harness.main()
