#!/usr/bin/env python3
"""End-to-end: the API's happy paths against a real daemon — load with progress, list, status,
tokenize/detokenize, greedy generation equal to the in-process engine (inferd-run), chat messages,
stop strings, maxTokens, unload.

    test_basic.py --bin-dir BUILD/bin --model MODEL.gguf [--inferd-run PATH]
"""
import os
import unittest

import harness
from harness import Connection, request, run_async

PROMPT = "The capital of France is"
CONTEXT = 512


class BasicTest(harness.DaemonTestCase):
    """One daemon for the class; each test loads the model under its own id and unloads it."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = harness.Daemon().start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def run_test(self, coro):
        return run_async(coro, daemons=[self.daemon])

    async def connect_and_load(self, model_id, **options):
        conn = await Connection.open(self.daemon.socket_path)
        options.setdefault("contextSize", CONTEXT)
        options.setdefault("parallel", 2)
        await conn.load(harness.Config.model, id=model_id, **options)
        return conn

    # ---------------------------------------------------------------------------------------------

    def test_load_with_progress_list_and_status(self):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            progress = harness.make_progress()
            info = await conn.load(harness.Config.model, progress, id="basic-load", contextSize=CONTEXT,
                                   parallel=3)
            self.assertEqual(info.id, "basic-load")
            self.assertEqual(info.state, "ready", f"load returned a model that is not ready: {info}")
            self.assertTrue(progress.updates, "load reported no progress through the LoadProgress capability")
            stages = {u[0] for u in progress.updates}
            self.assertLessEqual(stages, {"copying", "interleaving", "validating", "starting workers"},
                                 f"unknown progress stages: {progress.updates}")
            for stage, done, total in progress.updates:
                self.assertLessEqual(done, total, f"progress went past its total: {progress.updates}")

            listed = {m.id: m for m in await conn.list()}
            self.assertIn("basic-load", listed, f"Inference.list() lacks the loaded model: {list(listed)}")
            self.assertEqual(listed["basic-load"].path, harness.Config.model)

            st = await conn.status()
            self.assertEqual(st.pid, self.daemon.pid, "status().pid is not the daemon's pid")
            self.assertEqual(st.socketPath, self.daemon.socket_path)
            self.assertEqual(st.protocolVersion, harness.schema().protocolVersion)
            self.assertTrue(st.version, "status().version is empty")
            self.assertGreaterEqual(st.connections, 1, "status() counts no connection though this one is open")
            self.assertGreater(st.rssBytes, 0, "daemon rssBytes is 0")
            m = await conn.model_status("basic-load")
            self.assertIsNotNone(m, "status() lacks the loaded model")
            info = m.info
            file_size = os.path.getsize(harness.Config.model)
            self.assertGreater(info.weightsBytes, file_size // 2,
                               f"weightsBytes {info.weightsBytes} is implausibly small for a {file_size}-byte file")
            self.assertLess(info.weightsBytes, file_size * 2,
                            f"weightsBytes {info.weightsBytes} is implausibly large for a {file_size}-byte file")
            # Where the kernel gives 2 MiB pages (MADV_COLLAPSE, Linux 6.1+) the tensor data gets them; the
            # figure is whole pages and never more than the segment.
            self.assertLessEqual(info.weightsHugePageBytes, info.weightsBytes)
            self.assertEqual(info.weightsHugePageBytes % (2 << 20), 0,
                             f"weightsHugePageBytes {info.weightsHugePageBytes} is not whole 2 MiB pages")
            self.assertEqual(info.contextSize, CONTEXT, "contextSize is not what the load asked for")
            self.assertEqual(info.parallel, 3, "parallel is not what the load asked for")
            self.assertEqual(info.vocabSize, 49152, "SmolLM2's vocabulary has 49152 tokens")
            self.assertEqual(info.arch, "llama")
            self.assertTrue(info.placement.summary, "placement summary is empty")
            self.assertIn("layers", info.placement.summary, f"placement summary: {info.placement.summary!r}")
            self.assertEqual(len(info.placement.stages), 1, f"placement stages: {info.placement.stages}")
            stage = info.placement.stages[0]
            self.assertEqual((stage.firstLayer, stage.endLayer, stage.embeddings, stage.output), (0, 30, True, True),
                             f"one CPU stage should hold all 30 layers: {stage}")
            self.assertEqual(len(info.workers), 1, f"expected one worker: {info.workers}")
            w = info.workers[0]
            self.assertGreater(w.pid, 0)
            self.assertEqual(harness.process_name(w.pid), "inferd-worker",
                             f"status() reports worker pid {w.pid}, which is not an inferd-worker process")
            self.assertEqual(w.state, "ready")
            self.assertGreater(w.rssBytes, 0, "worker rssBytes is 0")
            self.assertEqual(w.restarts, 0)
            self.assertTrue(w.device, "worker device is empty")
            self.assertGreater(m.kvBytes, 0, "kvBytes is 0")
            self.assertEqual((m.slotsUsed, m.requestsActive, m.requestsQueued), (0, 0, 0))
            # The weights live in a memfd: never a file in /dev/shm, and the worker maps no model file.
            self.assertNotIn(harness.Config.model, harness.mapped_paths(w.pid),
                             "the worker maps the .gguf file instead of the shared weights")
            for path in harness.mapped_paths(w.pid) | set(harness.fd_targets(w.pid)):
                self.assertFalse(path.startswith("/dev/shm"), f"the worker uses {path}")
            await conn.unload("basic-load")
            conn.close()

        self.run_test(body())

    def test_tokenize_detokenize_round_trip(self):
        async def body():
            conn = await self.connect_and_load("basic-tok")
            for text in ["Hello, world!", "  leading spaces\tand tabs\nand lines", "Ünïcödé 日本語 🙂 ok",
                         "<|im_start|>user"]:
                ids = await conn.tokenize("basic-tok", text)
                self.assertTrue(ids, f"tokenize({text!r}) returned nothing")
                self.assertEqual(await conn.detokenize("basic-tok", ids), text,
                                 f"detokenize(tokenize({text!r})) = {ids} is not the text")
            plain = await conn.tokenize("basic-tok", "<|im_start|>", parse_special=False)
            special = await conn.tokenize("basic-tok", "<|im_start|>", parse_special=True)
            self.assertEqual(len(special), 1, f"<|im_start|> should be one special token: {special}")
            self.assertGreater(len(plain), 1, f"<|im_start|> as plain text should be several tokens: {plain}")
            await conn.unload("basic-tok")
            conn.close()

        self.run_test(body())

    def test_greedy_equals_inferd_run(self):
        n = 32
        expected = {p: harness.inferd_run(p, n) for p in
                    [PROMPT, "Once upon a time", "def fibonacci(n):"]}

        async def body():
            conn = await self.connect_and_load("basic-greedy")
            for prompt, want in expected.items():
                out = await conn.generate(request("basic-greedy", prompt, max_tokens=n, ignoreEog=False))
                self.assertCompleted(out, prompt)
                self.assertTextMatches(out, want,
                                       f"greedy text for {prompt!r} differs from inferd-run's (the in-process engine)")
                if out.result.finishReason == "maxTokens":
                    self.assertEqual(out.result.generatedTokens, n)
                self.assertEqual(out.result.promptTokens, len(await conn.tokenize("basic-greedy", prompt, True, True)))
                self.assertEqual(await conn.detokenize("basic-greedy", out.tokens), out.text,
                                 "detokenize of the streamed tokens differs from the streamed text")
            await conn.unload("basic-greedy")
            conn.close()

        self.run_test(body())

    def test_chat_messages(self):
        system = "You are a helpful assistant."
        question = "What is the capital of France?"
        want = harness.inferd_run(question, 24, chat=True, system=system)

        async def body():
            conn = await self.connect_and_load("basic-chat")
            messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
            out = await conn.generate(request("basic-chat", messages=messages, max_tokens=24))
            self.assertCompleted(out, "chat")
            self.assertTrue(out.text.strip(), f"chat generation produced no text: {out}")
            self.assertTextMatches(out, want, "chat output differs from inferd-run --chat (same template, greedy)")
            info = {m.id: m for m in await conn.list()}["basic-chat"]
            self.assertEqual(info.chatTemplate, "jinja", "SmolLM2's own template, rendered by the Jinja engine")
            await conn.unload("basic-chat")
            conn.close()

        self.run_test(body())

    def test_stop_strings_and_max_tokens(self):
        async def body():
            conn = await self.connect_and_load("basic-stop")
            full = await conn.generate(request("basic-stop", PROMPT, max_tokens=32, ignoreEog=True))
            self.assertCompleted(full, "reference")
            self.assertEqual(full.result.finishReason, "maxTokens")
            self.assertEqual(full.result.generatedTokens, 32)
            # A stop string taken from the middle of the reference text: the output is the text before it.
            words = full.text.split()
            self.assertGreaterEqual(len(words), 4, f"reference text too short: {full.text!r}")
            stop = words[len(words) // 2]
            cut = full.text.index(stop)
            out = await conn.generate(request("basic-stop", PROMPT, max_tokens=32, ignoreEog=True,
                                              stop=["no-such-stop-string", stop]))
            self.assertCompleted(out, f"stop={stop!r}")
            self.assertEqual(out.result.finishReason, "stop", f"stop string {stop!r} did not end the generation: {out}")
            self.assertTextMatches(out, full.text[:cut], f"the text should end right before {stop!r}")
            self.assertNotIn(stop, out.text)
            self.assertLess(len(out.tokens), 32)

            for n in (1, 7):
                short = await conn.generate(request("basic-stop", PROMPT, max_tokens=n, ignoreEog=True))
                self.assertEqual(short.result.finishReason, "maxTokens", f"maxTokens={n}: {short}")
                # generatedTokens == n and the tokens are the longer greedy run's first n.
                self.assertStreamMatches(short, full.tokens[:n], f"maxTokens={n}")
            await conn.unload("basic-stop")
            conn.close()

        self.run_test(body())

    # Steps queued ahead (steps-in-flight) and stream pacing (stream-interval) change when work happens,
    # never what is generated: greedy text, a stop string, maxTokens and a seeded sampled stream are the
    # same with 1 step in flight and unpaced streams, with the defaults (2 steps, 20 ms), and with 4 steps.
    def test_steps_in_flight_and_stream_interval_keep_the_output(self):
        async def outputs(daemon, model_id):
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=model_id, contextSize=CONTEXT, parallel=2)
            reqs = [request(model_id, PROMPT, max_tokens=24, ignoreEog=True),
                    request(model_id, PROMPT, max_tokens=24, ignoreEog=True, stop=[" the"]),
                    request(model_id, PROMPT, max_tokens=1),
                    request(model_id, "Once upon a time", max_tokens=24, temperature=0.9, seed=7, ignoreEog=True,
                            sampling={"topK": 40, "topP": 0.95, "repeatPenalty": 1.1})]
            outs = []
            for r in reqs:
                out = await conn.generate(r)
                self.assertCompleted(out, f"{daemon.args}: {r}")
                outs.append((out.tokens, out.text, str(out.result.finishReason), out.result.generatedTokens))
            await conn.unload(model_id)
            conn.close()
            return outs

        want = self.run_test(outputs(self.daemon, "basic-steps"))
        for args in (["--steps-in-flight=1", "--stream-interval=0"], ["--steps-in-flight=4", "--stream-interval=5"]):
            with self.subTest(args=args), harness.Daemon(*args) as other:
                got = run_async(outputs(other, "basic-steps"), daemons=[other])
                self.assertEqual(got, want, f"inferd {' '.join(args)} generated something else than the defaults")

    # Regression test for "lost final batch": the last batch used to leave in the same step as the end
    # of the generation, and generate returned before pycapnp had run the sink's last send() (one-token
    # generations lost their token about every other call). TokenSink.done() is the barrier.
    def test_final_batch_delivered(self):
        async def body():
            conn = await self.connect_and_load("basic-final")
            lost = []
            for i in range(20):
                out = await conn.generate(request("basic-final", PROMPT, max_tokens=1))
                self.assertIsNone(out.error, f"generate failed: {out}")
                if len(out.tokens) != out.result.generatedTokens:
                    lost.append(i)
            await conn.unload("basic-final")
            conn.close()
            self.assertEqual(lost, [], f"{len(lost)} of 20 one-token generations streamed no token although "
                                       "the result says generatedTokens=1")

        self.run_test(body())

    def test_a_chat_template_that_cannot_be_used_is_an_error_not_a_fallback(self):
        # The default model's template with its first tag replaced by one the engine does not know (same
        # length, so the file's offsets stay valid).
        with open(harness.Config.model, "rb") as f:
            data = f.read()
        start = data.index(b"{% for message in messages %}")
        bad_tag = b"{% frobnicate %}"
        patched = data[:start] + bad_tag + data[start + len(bad_tag):]
        path = os.path.join(self.daemon.dir, "bad-template.gguf")
        with open(path, "wb") as f:
            f.write(patched)
        messages = [{"role": "user", "content": "Hello"}]

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            await conn.load(path, id="basic-badtmpl", contextSize=CONTEXT)
            info = {m.id: m for m in await conn.list()}["basic-badtmpl"]
            self.assertEqual(info.chatTemplate, "jinja (unusable)")
            out = await conn.generate(request("basic-badtmpl", messages=messages, max_tokens=4))
            self.assertKjError(out.error, "FAILED", "frobnicate", "line 1", context="chat with an unusable template")
            out = await conn.generate(request("basic-badtmpl", "The capital of France is", max_tokens=4))
            self.assertCompleted(out, "a plain prompt still works")
            await conn.unload("basic-badtmpl")
            # A built-in format, asked for by name, replaces the file's template.
            await conn.load(path, id="basic-badtmpl", contextSize=CONTEXT, chatTemplate="chatml")
            info = {m.id: m for m in await conn.list()}["basic-badtmpl"]
            self.assertEqual(info.chatTemplate, "chatml")
            out = await conn.generate(request("basic-badtmpl", messages=messages, max_tokens=4))
            self.assertCompleted(out, "chat with the built-in format")
            await conn.unload("basic-badtmpl")
            await self.expect_error(conn.load(path, id="basic-badtmpl", chatTemplate="nonsense"), "FAILED",
                                    "unknown chat template 'nonsense'")
            conn.close()

        self.run_test(body())

    def test_unload(self):
        async def body():
            conn = await self.connect_and_load("basic-unload")
            pid = await conn.worker_pid("basic-unload")
            self.assertFalse(harness.process_gone(pid))
            await conn.unload("basic-unload")
            self.assertNotIn("basic-unload", [m.id for m in await conn.list()], "unloaded model still listed")
            self.assertIsNone(await conn.model_status("basic-unload"), "unloaded model still in status()")
            await harness.wait_until_async(lambda: harness.process_gone(pid), 10,
                                           f"worker {pid} of the unloaded model to exit")
            out = await conn.generate(request("basic-unload", PROMPT))
            self.assertKjError(out.error, "FAILED", "basic-unload", context="generate on an unloaded model")
            await self.expect_error(conn.unload("basic-unload"), "FAILED", "basic-unload",
                                    context="unloading twice")
            # The same id can be loaded again.
            await conn.load(harness.Config.model, id="basic-unload", contextSize=CONTEXT)
            self.assertCompleted(await conn.generate(request("basic-unload", PROMPT, max_tokens=4)), "after reload")
            await conn.unload("basic-unload")
            conn.close()

        self.run_test(body())

    def test_sigterm_stops_cleanly(self):
        # A separate daemon: SIGTERM with a model loaded exits 0, takes its worker along, removes the socket.
        daemon = harness.Daemon().start()

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id="basic-term", contextSize=CONTEXT)
            pid = await conn.worker_pid("basic-term")
            conn.close()
            return pid

        pid = run_async(body(), daemons=[daemon])
        socket_path = daemon.socket_path
        rc = daemon.stop(remove_dir=False)
        self.assertEqual(rc, 0, f"inferd exited with {rc} on SIGTERM\n{daemon.log_tail()}")
        self.assertTrue(harness.process_gone(pid), f"worker {pid} outlived the daemon")
        self.assertFalse(os.path.exists(socket_path), "the socket file is left after a clean stop")
        daemon.stop()


if __name__ == "__main__":
    harness.main()
