#!/usr/bin/env python3
"""End-to-end: the prefix cache. A chat's next turn resends the conversation; with the cache the daemon
computes only what is new — and the output is the one it gives with the cache off, token for token:
greedy and seeded sampling, two slots at once with steps in flight, a two-stage pipeline, and a worker
killed with SIGKILL in the middle of a turn (its cache is gone; the replay must not depend on it).

    test_prefix_cache.py --bin-dir BUILD/bin --model MODEL.gguf
"""
import os
import signal
import unittest

import harness
from harness import Connection, request, run_async

CONTEXT = 1024
SYSTEM = ("You are a careful assistant for a small bakery. You answer questions about bread, pastry, "
          "opening hours and allergens. Keep answers short and concrete, and say so when you do not know. ") * 3
QUESTIONS = ["What bread do you recommend for sandwiches?", "Is it vegan?", "And for breakfast?",
             "How long does it keep?"]


class PrefixCacheTest(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = harness.Daemon().start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def run_test(self, coro):
        return run_async(coro, daemons=[self.daemon])

    async def chat(self, conn, model_id, cache, sampling, turns=len(QUESTIONS), on_turn=None):
        """A conversation: each turn resends the history plus a new question. Returns each turn's
        outcome."""
        messages = [{"role": "system", "content": SYSTEM}]
        outcomes = []
        for i, q in enumerate(QUESTIONS[:turns]):
            messages.append({"role": "user", "content": q})
            req = request(model_id, messages=list(messages), max_tokens=24, cachePrompt=cache, **sampling)
            on_batch = on_turn(i) if on_turn else None
            out = await conn.generate(req, on_batch)
            self.assertCompleted(out, f"turn {i} (cache {cache})")
            outcomes.append(out)
            messages.append({"role": "assistant", "content": out.text})
        return outcomes

    def assertSameTurns(self, with_cache, without, context):
        for i, (a, b) in enumerate(zip(with_cache, without)):
            self.assertEqual(a.tokens, b.tokens, f"{context}, turn {i}: the cache changed the output")

    def check_model(self, model_id, **load):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            await conn.load(harness.Config.model, id=model_id, contextSize=CONTEXT, parallel=2, **load)
            for name, sampling in [("greedy", {}), ("seeded", {"temperature": 0.8, "seed": 1234})]:
                without = await self.chat(conn, model_id, False, sampling)
                with_cache = await self.chat(conn, model_id, True, sampling)
                self.assertSameTurns(with_cache, without, f"{model_id} {name}")
                for i, out in enumerate(without):
                    self.assertEqual(out.result.cachedTokens, 0, f"turn {i} without the cache reports cached tokens")
                # From the second turn on, the history's full blocks come from the cache (cache-off runs
                # publish nothing, so the first turn with the cache finds nothing).
                for i, out in enumerate(with_cache[1:], start=1):
                    self.assertGreaterEqual(out.result.cachedTokens, 64, f"{name} turn {i} took nothing from the cache")
                    self.assertEqual(out.result.cachedTokens % 64, 0)
                    self.assertLess(out.result.cachedTokens, out.result.promptTokens)
            st = await conn.model_status(model_id)
            self.assertEqual(st.cacheBlocks, 2 * CONTEXT // 64, "the pool is parallel x context")
            self.assertEqual(st.cacheBlocksUsed, 0, "blocks still held with no request in flight")
            self.assertGreater(st.cacheBlocksCached, 0)
            self.assertGreaterEqual(st.cacheHits, 2 * (len(QUESTIONS) - 1))
            self.assertGreater(st.cacheHitTokens, 0)
            await conn.unload(model_id)
            conn.close()

        self.run_test(body())

    def test_chat_turns_equal_with_and_without_the_cache(self):
        self.check_model("pc-one")

    def test_two_stage_pipeline(self):
        self.check_model("pc-pipe", layerSplit=[15])

    def test_two_slots_at_once_share_the_system_prompt(self):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            await conn.load(harness.Config.model, id="pc-two", contextSize=CONTEXT, parallel=2)
            reqs = [request("pc-two", messages=[{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": q}], max_tokens=24, cachePrompt=c)
                    for c in (False, True) for q in QUESTIONS]
            alone = [await conn.generate(r) for r in reqs[:len(QUESTIONS)]]
            # Prime the cache with the system prompt, then run them two at a time (steps in flight).
            self.assertCompleted(await conn.generate(reqs[len(QUESTIONS)]))
            cached = reqs[len(QUESTIONS):]
            for k in range(0, len(cached), 2):
                pair = [conn.start_generate(r) for r in cached[k:k + 2]]
                for j, fut in enumerate(pair):
                    out = await fut
                    self.assertCompleted(out)
                    self.assertEqual(out.tokens, alone[k + j].tokens, f"question {k + j} with the cache")
                    self.assertGreaterEqual(out.result.cachedTokens, 64)
            await conn.unload("pc-two")
            conn.close()

        self.run_test(body())

    def test_kill_9_mid_conversation(self):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            await conn.load(harness.Config.model, id="pc-kill", contextSize=CONTEXT, parallel=2)
            sampling = {"temperature": 0.8, "seed": 99}
            without = await self.chat(conn, "pc-kill", False, sampling)
            pid = await conn.worker_pid("pc-kill")
            killed = []

            def on_turn(i):
                if i != 2:
                    return None

                async def kill_after_three(sink):
                    if not killed and len(sink.tokens) >= 3:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(len(sink.tokens))
                return kill_after_three

            with_cache = await self.chat(conn, "pc-kill", True, sampling, on_turn=on_turn)
            self.assertEqual(len(killed), 1, "the worker was not killed during turn 2")
            self.assertSameTurns(with_cache, without, "kill -9 in turn 2")
            self.assertGreaterEqual(with_cache[2].result.replays, 1, "turn 2 was not replayed")
            await conn.unload("pc-kill")
            conn.close()

        self.run_test(body())


if __name__ == "__main__":
    harness.main()
