#!/usr/bin/env python3
"""End-to-end: worker and supervisor crashes.

- kill -9 of the worker mid-generation, 50 times: every request completes with the output of an
  uninterrupted run (replayed from its prompt and streamed tokens, sampler resumed) or fails with one
  clear DISCONNECTED; the worker comes back every time (restart times are printed); the model file is
  never re-read; /dev/shm and the daemon's open descriptors are the same after the loop as before.
- a request that loses its worker more than 3 times fails with DISCONNECTED.
- a worker that aborts before ready, every time (the test worker inferd-fault-worker, fault "start"):
  the load fails clearly, the daemon goes on.
- restart intensity: more than --max-restarts crashes in the window mark the model failed.
- kill -9 of the supervisor: its worker exits too; a new daemon takes over the stale socket.

    test_crash.py --bin-dir BUILD/bin --model MODEL.gguf
"""
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys

import harness
from harness import Connection, request, run_async

MODEL_ID = "crash"
N_KILLS = 50
N_TOKENS = 20
RESTART_TIMEOUT_S = 20


def references_requests():
    """The requests the kill loop cycles through: sampled ones (the sampler must resume at the same
    draw after a replay) and greedy ones, all of a known length."""
    prompts = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "Water boils at",
               "My favourite food is"]
    return [request(MODEL_ID, p, max_tokens=N_TOKENS, temperature=0.0 if i % 2 else 0.8, seed=77 + i,
                    ignoreEog=True) for i, p in enumerate(prompts)]


def check_no_model_mapping(test, pid, model_path, who):
    paths = harness.mapped_paths(pid)
    test.assertFalse([p for p in paths if model_path in p],
                     f"{who} (pid {pid}) maps the model file {model_path}: the weights should come from "
                     f"the shared segment only")
    test.assertFalse([p for p in harness.fd_targets(pid) if model_path in p],
                     f"{who} (pid {pid}) holds the model file {model_path} open")
    test.assertFalse([p for p in paths if p.startswith("/dev/shm")], f"{who} maps files in /dev/shm: {paths}")


class CrashTest(harness.DaemonTestCase):

    async def wait_restarted(self, conn, old_pid, model_id=MODEL_ID):
        """Polls status until the model's worker is a new, ready process; returns its ModelStatus."""
        async def restarted():
            m = await conn.model_status(model_id)
            if m is None or not m.info.workers:
                return None
            w = m.info.workers[0]
            return m if w.pid != old_pid and w.pid != 0 and w.state == "ready" and m.info.state == "ready" else None

        return await harness.wait_until_async(restarted, RESTART_TIMEOUT_S,
                                              f"worker {old_pid} of {model_id} to be replaced by a ready one")

    def test_kill_worker_mid_generation_50_times(self):
        shm_before = harness.dev_shm_listing()
        daemon = harness.Daemon("--max-restarts", "1000", "--restart-window", "1").start()
        self.addCleanup(daemon.stop)
        model_copy = harness.copy_model(daemon.dir)
        rng = random.Random(20240601)
        requests = references_requests()
        stats = {"replayed": 0, "disconnected": 0, "finished_before_kill": 0}
        restart_ms = []

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(model_copy, id=MODEL_ID, parallel=2, contextSize=256)
            # The file is gone from here on: a restart that re-read it would fail.
            os.unlink(model_copy)
            pid = await conn.worker_pid(MODEL_ID)
            check_no_model_mapping(self, daemon.pid, model_copy, "the daemon")
            check_no_model_mapping(self, pid, model_copy, "the worker")

            # Uninterrupted references; each asks for more tokens than the loop does and keeps the
            # first N_TOKENS.
            refs = []
            for i, r in enumerate(requests):
                out = await conn.generate(dict(r, maxTokens=N_TOKENS + 8))
                self.assertCompleted(out, f"reference {i}")
                self.assertGreaterEqual(len(out.tokens), N_TOKENS, f"reference {i}: {out}")
                refs.append(out.tokens[:N_TOKENS])

            fds_before = harness.fd_count(daemon.pid)
            replays_before = (await conn.model_status(MODEL_ID)).replays
            for k in range(N_KILLS):
                pid = await conn.worker_pid(MODEL_ID)
                kill_after = rng.randint(4, 8)
                killed = []

                async def kill_worker(sink):
                    if not killed and len(sink.tokens) >= kill_after:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(len(sink.tokens))

                which = k % len(requests)
                out = await conn.generate(requests[which], kill_worker)
                context = f"kill {k} (request {which}, worker {pid} killed after {killed} tokens)"
                self.assertEqual(len(killed), 1, f"{context}: the sink never reached {kill_after} tokens: {out}")
                if out.error is not None:
                    self.assertKjError(out.error, "DISCONNECTED", "worker", context=context)
                    stats["disconnected"] += 1
                else:
                    self.assertStreamMatches(out, refs[which], f"{context}: output differs from the uninterrupted run")
                    if out.result.replays >= 1:
                        stats["replayed"] += 1
                    else:
                        stats["finished_before_kill"] += 1
                m = await self.wait_restarted(conn, pid)
                w = m.info.workers[0]
                self.assertGreater(w.lastRestartMs, 0.0, f"{context}: lastRestartMs not reported: {w}")
                restart_ms.append(w.lastRestartMs)
                check_no_model_mapping(self, w.pid, model_copy, f"the restarted worker ({context})")

            m = await conn.model_status(MODEL_ID)
            self.assertEqual(m.info.workers[0].restarts, N_KILLS, "restarts counter")
            self.assertGreaterEqual(m.replays - replays_before, stats["replayed"], "status().replays")
            self.assertEqual((m.slotsUsed, m.requestsActive, m.requestsQueued), (0, 0, 0))
            check_no_model_mapping(self, daemon.pid, model_copy, "the daemon")
            self.assertEqual(harness.fd_count(daemon.pid), fds_before,
                             f"the daemon's open descriptors changed over {N_KILLS} worker restarts: "
                             f"{sorted(harness.fd_targets(daemon.pid))}")
            # The replays did most of the work: most kills hit a request in flight.
            self.assertGreater(stats["replayed"] + stats["disconnected"], N_KILLS // 2, f"{stats}")
            await conn.unload(MODEL_ID)
            conn.close()

        run_async(body(), daemons=[daemon])
        self.assertEqual(harness.dev_shm_listing(), shm_before, "/dev/shm changed")
        restart_ms.sort()
        print(f"\nworker kill -9 x{N_KILLS}: {stats['replayed']} requests replayed and completed identically, "
              f"{stats['disconnected']} ended DISCONNECTED, {stats['finished_before_kill']} had finished before "
              f"the kill landed", file=sys.stderr)
        print(f"lastRestartMs over {len(restart_ms)} restarts: min {restart_ms[0]:.1f} ms, median "
              f"{statistics.median(restart_ms):.1f} ms, max {restart_ms[-1]:.1f} ms", file=sys.stderr)

    def test_request_fails_disconnected_after_4_worker_deaths(self):
        daemon = harness.Daemon("--max-restarts", "1000", "--restart-window", "1").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=256)
            kills = []

            async def kill_every_3_tokens(sink):
                # Tokens arrive only from a ready worker, so status names the one that runs now.
                if len(sink.tokens) >= 3 * (len(kills) + 1) and len(kills) < 4:
                    pid = await conn.worker_pid(MODEL_ID)
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)

            out = await conn.generate(request(MODEL_ID, "Once upon a time", max_tokens=60, ignoreEog=True),
                                      kill_every_3_tokens)
            self.assertEqual(len(set(kills)), 4, f"expected 4 different workers killed: {kills}; {out}")
            self.assertKjError(out.error, "DISCONNECTED", "died", "retry",
                               context="a request whose worker died 4 times (more than 3 replays)")
            self.assertLess(len(out.tokens), 60)
            await self.wait_restarted(conn, kills[-1])
            after = await conn.generate(request(MODEL_ID, "Hello", max_tokens=4))
            self.assertCompleted(after, "generate after the DISCONNECTED request")
            self.assertEqual(after.result.generatedTokens, 4)
            conn.close()

        run_async(body(), daemons=[daemon])

    # A step that fails in the worker (a backend error; the worker lives on) fails the requests in that
    # step with its message. With steps queued ahead, the step after it was built on its results: that
    # one is dropped and every other sequence restarts from position 0, so the daemon keeps serving and
    # later output is exact.
    def test_failed_step_fails_its_requests_and_the_daemon_keeps_serving(self):
        prompt, n = "Once upon a time", 24
        want = harness.inferd_run(prompt, n)
        daemon = harness.Daemon(fault="step:5").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, contextSize=512, parallel=2)
            pid = (await conn.status()).models[0].info.workers[0].pid
            failed = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=True))
            self.assertKjError(failed.error, "FAILED", "injected fault", context="the request in the failed step")
            self.assertLess(len(failed.tokens), n)
            for i in range(2):
                out = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=False))
                self.assertCompleted(out, f"request {i} after the failed step")
                self.assertTextMatches(out, want, "output after a failed step differs from inferd-run's")
            st = (await conn.status()).models[0]
            self.assertEqual(st.info.workers[0].pid, pid, "a failed step must not restart the worker")
            self.assertEqual(st.requestsFailed, 1)
            conn.close()

        run_async(body(), daemons=[daemon])

    # A step that leaves the device unusable (a GPU's sticky error: the CUDA backend reports itself
    # unhealthy) fails its requests with the message, and the worker exits: the supervisor restarts it
    # like a crashed one, and the daemon serves exact output on the new worker.
    def test_device_fault_restarts_the_worker_and_the_daemon_keeps_serving(self):
        prompt, n = "Once upon a time", 24
        want = harness.inferd_run(prompt, n)
        daemon = harness.Daemon(fault="device:5").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, contextSize=512, parallel=2)
            pid = (await conn.status()).models[0].info.workers[0].pid
            failed = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=True))
            self.assertKjError(failed.error, "FAILED", "injected device fault", context="the request in the failed step")
            await self.wait_restarted(conn, pid)
            for i in range(2):
                out = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=False))
                self.assertCompleted(out, f"request {i} after the device fault")
                self.assertTextMatches(out, want, "output after a device fault differs from inferd-run's")
            conn.close()

        run_async(body(), daemons=[daemon])

    # A worker that never gets ready (stuck before its backend is made): start-timeout kills it, the
    # restarts fail the same way, and the load fails with the reason instead of hanging; the daemon serves on.
    def test_worker_never_ready_fails_the_load_after_start_timeout(self):
        daemon = harness.Daemon("--start-timeout", "0.5", "--max-restarts", "1", fault="hang").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await self.expect_error(asyncio.wait_for(conn.load(harness.Config.model, id=MODEL_ID), 60), "FAILED",
                                    "worker", context="load while every worker hangs before ready")
            self.assertIn("is not ready", daemon.log())
            st = await conn.status()
            self.assertEqual([m.info.id for m in st.models], [], "the failed model is still registered")

            async def no_children():
                return harness.children(daemon.pid) == []

            await harness.wait_until_async(no_children, 10, "the hung workers to be gone")
            conn.close()

        run_async(body(), daemons=[daemon])

    # Where a load stands is in status for every client, not only the one loading: here its workers hang
    # before ready, so the load stays at "starting workers" until it is unloaded.
    def test_status_and_inferctl_show_where_a_load_stands(self):
        daemon = harness.Daemon("--start-timeout", "120", fault="hang").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            loading = asyncio.ensure_future(conn.load(harness.Config.model, id=MODEL_ID))
            other = await Connection.open(daemon.socket_path)

            async def starting():
                st = await other.status()
                return bool(st.models) and st.models[0].info.loadStage == "starting workers"

            await harness.wait_until_async(starting, 60, "status to show the load starting its workers")
            info = (await other.status()).models[0].info
            self.assertEqual(str(info.state), "loading")
            ps = subprocess.run([os.path.join(harness.Config.bin_dir, "inferctl"), "--socket", daemon.socket_path, "ps"],
                                capture_output=True, text=True, timeout=60)
            self.assertEqual(ps.returncode, 0, ps.stderr)
            self.assertIn("loading (starting workers)", ps.stdout)
            await other.unload(MODEL_ID)
            await self.expect_error(asyncio.wait_for(loading, 60), "FAILED", "unloaded", context="load unloaded while starting")
            other.close()
            conn.close()

        run_async(body(), daemons=[daemon])

    # Hostile workers, each through a whole daemon: a completion counter far past anything published, a
    # submission counter from the future, a completion naming a token outside the vocabulary with more
    # embedding floats than exist, and a header whose geometry is scribbled over. The first three are
    # killed and their request replayed with nothing lost (the output equals inferd-run's); the fourth
    # changes nothing the supervisor reads, so nothing happens at all.
    def test_hostile_workers_are_killed_or_ignored_and_requests_complete(self):
        prompt, n = "Once upon a time", 24
        want = harness.inferd_run(prompt, n)
        for fault, evidence, killed in (("ring:3", "wrote ring counters out of order", True),
                                        ("subtail:3", "wrote ring counters out of order", True),
                                        ("entry:3", "malformed completion", True),
                                        ("geometry:2", None, False)):
            with self.subTest(fault=fault):
                daemon = harness.Daemon(fault=fault).start()
                self.addCleanup(daemon.stop)

                async def body():
                    conn = await Connection.open(daemon.socket_path)
                    await conn.load(harness.Config.model, id=MODEL_ID, contextSize=512, parallel=2)
                    pid = (await conn.status()).models[0].info.workers[0].pid
                    out = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=False))
                    self.assertCompleted(out, f"the request on the worker with fault {fault}")
                    self.assertTextMatches(out, want, f"output with fault {fault} differs from inferd-run's")
                    if killed:
                        self.assertIn(evidence, daemon.log())
                        m = await self.wait_restarted(conn, pid)
                        self.assertGreaterEqual(m.replays, 1)
                    else:
                        m = await conn.model_status(MODEL_ID)
                        self.assertEqual(m.info.workers[0].pid, pid, "a worker that only scribbled was replaced")
                        self.assertEqual(m.replays, 0)
                    conn.close()

                run_async(body(), daemons=[daemon])
                daemon.stop()

    def test_worker_crash_loop_at_start_fails_the_load(self):
        daemon = harness.Daemon(fault="start").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            e = await self.expect_error(conn.load(harness.Config.model, id=MODEL_ID), "FAILED", "worker",
                                        context="load while every worker aborts before ready")
            self.assertTrue("start" in e.description or "abort" in e.description.lower() or
                            "signal" in e.description, f"the error should say the worker did not start: "
                                                       f"{e.description}")
            st = await conn.status()
            self.assertEqual(st.pid, daemon.pid, "status() after the failed load")
            self.assertEqual([m.info.id for m in st.models], [], "the failed model is still registered")
            out = await conn.generate(request(MODEL_ID, "Hello"))
            self.assertKjError(out.error, "FAILED", MODEL_ID, context="generate on the model whose load failed")

            async def no_children():
                return harness.children(daemon.pid) == []

            await harness.wait_until_async(no_children, 10, "the daemon's worker processes to be gone")
            conn.close()

        run_async(body(), daemons=[daemon])
        self.assertIsNone(daemon.proc.poll(), "the daemon exited after a crash loop of its workers")

    def test_restart_intensity_marks_model_failed(self):
        daemon = harness.Daemon("--max-restarts", "2", "--restart-window", "60").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=256)
            pid = await conn.worker_pid(MODEL_ID)
            for _ in range(2):  # two crashes are within the limit: the worker comes back
                os.kill(pid, signal.SIGKILL)
                pid = (await self.wait_restarted(conn, pid)).info.workers[0].pid
            os.kill(pid, signal.SIGKILL)  # the third is one too many

            async def failed():
                m = await conn.model_status(MODEL_ID)
                return m if m.info.state == "failed" else None

            m = await harness.wait_until_async(failed, RESTART_TIMEOUT_S, "the model to be marked failed")
            self.assertEqual(m.info.workers[0].state, "failed", f"worker state: {m.info.workers[0]}")
            self.assertTrue(harness.process_gone(pid))
            out = await conn.generate(request(MODEL_ID, "Hello"))
            self.assertKjError(out.error, "FAILED", MODEL_ID, "failed", "crashed 3 times", "load it again",
                               context="generate on a failed model")
            # The way out the error names: unload, load again.
            await conn.unload(MODEL_ID)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=256)
            again = await conn.generate(request(MODEL_ID, "Hello", max_tokens=4))
            self.assertCompleted(again, "generate after unload + load of the failed model")
            conn.close()

        run_async(body(), daemons=[daemon])

    def test_supervisor_kill9_takes_workers_along_and_socket_is_reused(self):
        shm_before = harness.dev_shm_listing()
        daemon = harness.Daemon()
        daemon.start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=256)
            pid = await conn.worker_pid(MODEL_ID)

            async def kill_daemon(sink):
                if len(sink.tokens) >= 3 and daemon.proc.poll() is None:
                    daemon.kill9()

            out = await conn.generate(request(MODEL_ID, "Once upon a time", max_tokens=200, ignoreEog=True),
                                      kill_daemon)
            self.assertIsNotNone(out.error, f"the generate survived the daemon's death: {out}")
            self.assertEqual(out.error.type, "DISCONNECTED", f"{out.error.description}")
            return pid

        worker = run_async(body(), daemons=[daemon])
        harness.wait_until(lambda: harness.process_gone(worker), 10,
                           f"worker {worker} to exit after its supervisor was killed (PDEATHSIG)")
        self.assertTrue(os.path.exists(daemon.socket_path), "expected the dead daemon's socket file to remain")

        successor = harness.Daemon(socket_path=daemon.socket_path)
        successor.start()
        self.addCleanup(successor.stop)
        self.assertIn("stale socket", successor.log(), "the new daemon did not say it replaced the stale socket")

        async def serve():
            conn = await Connection.open(successor.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=256)
            out = await conn.generate(request(MODEL_ID, "Hello", max_tokens=4))
            self.assertCompleted(out, "generate on the successor daemon")
            conn.close()

        run_async(serve(), daemons=[successor])
        self.assertEqual(harness.dev_shm_listing(), shm_before, "/dev/shm changed")


if __name__ == "__main__":
    harness.main()
