#!/usr/bin/env python3
"""End-to-end: many clients at once. 16 streaming clients on separate connections, each with a fixed
seed, must get exactly what the same request gets when it runs alone (continuous batching with 4 KV
slots, so requests also queue); a full admission queue answers OVERLOADED and the daemon goes on.

    test_concurrency.py --bin-dir BUILD/bin --model MODEL.gguf
"""
import asyncio

import harness
from harness import Connection, request, run_async

MODEL_ID = "conc"
N_CLIENTS = 16
N_TOKENS = 20
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "My favourite food is",
           "The weather today", "In 1969, the first", "Water boils at", "A haiku about autumn:"]


def client_requests():
    """16 requests: most sampled at temperature 0.8 with fixed seeds, every fourth greedy. Each keeps
    going past end-of-generation so all have the same, known length."""
    out = []
    for i in range(N_CLIENTS):
        greedy = i % 4 == 3
        out.append(request(MODEL_ID, PROMPTS[i % len(PROMPTS)], max_tokens=N_TOKENS,
                           temperature=0.0 if greedy else 0.8, seed=1000 + i, ignoreEog=True))
    return out


class ConcurrencyTest(harness.DaemonTestCase):

    def test_16_concurrent_clients_match_solo_runs(self):
        daemon = harness.Daemon().start()
        self.addCleanup(daemon.stop)
        requests = client_requests()

        async def body():
            admin = await Connection.open(daemon.socket_path)
            await admin.load(harness.Config.model, id=MODEL_ID, parallel=4, contextSize=256)
            # References: each request alone, one after another. A solo run asks for a few more tokens
            # and its first N_TOKENS are the reference.
            solo = []
            for i, r in enumerate(requests):
                out = await admin.generate(dict(r, maxTokens=N_TOKENS + 8))
                self.assertCompleted(out, f"solo run {i}")
                self.assertGreaterEqual(len(out.tokens), N_TOKENS, f"solo run {i}: {out}")
                solo.append(out.tokens[:N_TOKENS])
            # Same prompt, sampled, different seeds: different text, or the seed is not used.
            self.assertEqual(requests[0]["input"], requests[8]["input"])
            self.assertNotEqual(solo[0], solo[8], "two seeds gave the same sampled continuation")

            conns = [await Connection.open(daemon.socket_path, f"client-{i}") for i in range(N_CLIENTS)]
            steps_before = (await admin.model_status(MODEL_ID)).info.workers[0].steps
            peak = {"active": 0, "queued": 0}

            async def watch():
                # Samples the scheduler while the clients run (cancelled when they are done).
                while True:
                    m = await admin.model_status(MODEL_ID)
                    peak["active"] = max(peak["active"], m.requestsActive)
                    peak["queued"] = max(peak["queued"], m.requestsQueued)
                    await asyncio.sleep(harness.POLL_INTERVAL_S)

            watcher = asyncio.ensure_future(watch())
            outs = await asyncio.gather(*(c.generate(r) for c, r in zip(conns, requests)))
            watcher.cancel()
            for i, (out, ref) in enumerate(zip(outs, solo)):
                self.assertStreamMatches(out, ref, f"client {i}: concurrent output differs from the solo run")
                self.assertEqual(out.result.seed, 1000 + i, f"client {i}: the result reports another seed")
            self.assertLessEqual(peak["active"], 4, f"more requests active than KV slots: {peak}")
            # 16 requests on 4 slots: at least 12 waited for a whole request to finish first.
            waited = sorted(o.result.queueMs for o in outs)
            self.assertGreater(waited[4], 10.0, f"too few requests queued for a slot; queueMs: {waited}")
            # Continuous batching: sequences share steps, so there are far fewer steps than tokens.
            steps = (await admin.model_status(MODEL_ID)).info.workers[0].steps - steps_before
            generated = sum(o.result.generatedTokens for o in outs)
            self.assertLess(steps, generated / 2, f"{steps} worker steps for {generated} generated tokens: "
                                                  "the requests were not batched")
            m = await admin.model_status(MODEL_ID)
            self.assertEqual((m.slotsUsed, m.requestsActive, m.requestsQueued), (0, 0, 0),
                             "slots or requests are still in use after every client finished")
            self.assertEqual(m.requestsFailed, 0)
            for c in conns:
                c.close()
            admin.close()

        run_async(body(), daemons=[daemon])

    def test_overloaded_when_queue_full(self):
        # One slot, one queue place: a running request, a queued one, and the third is refused.
        daemon = harness.Daemon("--max-queue", "1").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, parallel=1, contextSize=512)
            other = await Connection.open(daemon.socket_path, "queued-and-refused")
            started = asyncio.get_running_loop().create_future()

            async def first_token(sink):
                if not started.done():
                    started.set_result(None)

            # Long enough to still run while the next two arrive (they need only a round trip).
            running = conn.start_generate(
                request(MODEL_ID, "Count to one thousand:", max_tokens=400, ignoreEog=True), first_token)
            await started
            # Calls on one connection reach the daemon in order: the first queues, the second is refused.
            queued = other.start_generate(request(MODEL_ID, "Hello", max_tokens=4))
            refused = await other.generate(request(MODEL_ID, "Hello again", max_tokens=4))
            self.assertKjError(refused.error, "OVERLOADED", "max-queue", context="third request with max-queue 1")
            self.assertEqual(refused.tokens, [], "a refused request streamed tokens")
            st = await conn.status()
            self.assertGreaterEqual(st.requestsRejected, 1, "status() does not count the OVERLOADED answer")
            other.close()  # cancels the queued request
            conn.close()  # cancels the running one
            for task in (running, queued):
                out = await task
                self.assertIsNotNone(out.error, f"a request on a closed connection completed: {out}")

            # The daemon still serves, and nothing is left in the slots or the queue.
            fresh = await Connection.open(daemon.socket_path)

            async def idle():
                m = await fresh.model_status(MODEL_ID)
                return (m.slotsUsed, m.requestsActive, m.requestsQueued) == (0, 0, 0)

            await harness.wait_until_async(idle, 10, "the cancelled requests to leave their slot and the queue")
            out = await fresh.generate(request(MODEL_ID, "Hello", max_tokens=4))
            self.assertCompleted(out, "generate after OVERLOADED")
            self.assertEqual(out.result.generatedTokens, 4)
            fresh.close()

        run_async(body(), daemons=[daemon])


if __name__ == "__main__":
    harness.main()
