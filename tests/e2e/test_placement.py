#!/usr/bin/env python3
"""End-to-end: pipeline placement (LoadOptions.layerSplit), one worker process per stage.

- A model split across three workers (layers 0-9, 10-19, 20-29) streams exactly the tokens the
  single-worker placement streams, greedy and sampled; status shows the plan and one worker per stage.
- kill -9 of the middle stage mid-generation: the request is replayed on all stages and completes with
  the uninterrupted output; only the killed stage's worker is replaced.
- A bad split (not increasing, outside the layers) is refused with a clear message.

    test_placement.py --bin-dir BUILD/bin --model MODEL.gguf
"""
import os
import signal

import harness
from harness import Connection, request, run_async

PROMPTS = ["The capital of France is", "Once upon a time"]


class PlacementTest(harness.DaemonTestCase):

    def test_split_equals_single_worker_and_survives_a_stage_crash(self):
        daemon = harness.Daemon("--max-restarts", "100").start()
        self.addCleanup(daemon.stop)

        async def body():
            conn = await Connection.open(daemon.socket_path)
            await conn.load(harness.Config.model, id="whole", parallel=2, contextSize=256)
            info = (await conn.load(harness.Config.model, id="split", parallel=2, contextSize=256,
                                    layerSplit=[10, 20]))
            stages = [(s.worker, s.firstLayer, s.endLayer, s.embeddings, s.output) for s in info.placement.stages]
            self.assertEqual(stages, [(0, 0, 10, True, False), (1, 10, 20, False, False), (2, 20, 30, False, True)],
                             f"placement: {info.placement}")
            self.assertIn("layers 10-19", info.placement.summary)
            m = await conn.model_status("split")
            pids = [w.pid for w in m.info.workers]
            self.assertEqual(len(set(pids)), 3, f"one worker process per stage: {m.info.workers}")
            self.assertTrue(all(w.state == "ready" for w in m.info.workers), f"{m.info.workers}")

            requests = [request(None, p, max_tokens=24, temperature=t, seed=11, ignoreEog=True)
                        for p in PROMPTS for t in (0.0, 0.9)]
            refs = []
            for i, r in enumerate(requests):
                a = await conn.generate(dict(r, model="whole"))
                b = await conn.generate(dict(r, model="split"))
                self.assertCompleted(a, f"request {i} on one worker")
                self.assertStreamMatches(b, a.tokens, f"request {i}: the pipeline differs from one worker")
                refs.append(a.tokens)

            # Kill the middle stage after a few tokens: the request is replayed on every stage.
            killed = []

            async def kill_middle(sink):
                if not killed and len(sink.tokens) >= 6:
                    os.kill(pids[1], signal.SIGKILL)
                    killed.append(len(sink.tokens))

            out = await conn.generate(dict(requests[1], model="split"), kill_middle)
            self.assertEqual(len(killed), 1, f"the kill never happened: {out}")
            self.assertStreamMatches(out, refs[1], "after the middle stage was killed")
            self.assertGreaterEqual(out.result.replays, 1, f"{out}")

            async def replaced():
                s = await conn.model_status("split")
                ws = s.info.workers
                ok = ws[1].pid not in (0, pids[1]) and all(w.state == "ready" for w in ws)
                return s if ok else None

            s = await harness.wait_until_async(replaced, 20, "the middle stage to be replaced")
            self.assertEqual([w.pid for w in s.info.workers][0::2], pids[0::2],
                             "only the killed stage's worker is replaced")
            self.assertEqual(s.info.workers[1].restarts, 1)

            # Bad splits are refused, and the daemon goes on.
            for bad in ([20, 10], [0], [30], [5, 5]):
                await self.expect_error(conn.load(harness.Config.model, id="bad", layerSplit=bad), "FAILED",
                                        "layer split", context=f"layerSplit={bad}")
            after = await conn.generate(dict(requests[0], model="split"))
            self.assertStreamMatches(after, refs[0], "after the refused loads")
            await conn.unload("split")
            await conn.unload("whole")
            conn.close()

        run_async(body(), daemons=[daemon])


if __name__ == "__main__":
    harness.main()
