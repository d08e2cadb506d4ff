#!/usr/bin/env python3
"""End-to-end: the second real model, Gemma 3 270M (gemma3 architecture, 262,144-token SentencePiece
vocabulary, sliding-window layers), through a real daemon: greedy text equal to the in-process engine
(inferd-run), chat in Gemma's turn format, a prompt longer than the sliding window, the tokenizer through
the API.

    test_gemma3.py --bin-dir BUILD/bin --model models/gemma-3-270m-q4_k_m.gguf [--inferd-run PATH]
"""
import unittest

import harness
from harness import Connection, request, run_async

CONTEXT = 1024
MODEL_ID = "gemma3"


class Gemma3Test(harness.DaemonTestCase):
    """One daemon and one load of the model for the class."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = harness.Daemon().start()

        async def load():
            conn = await Connection.open(cls.daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL_ID, contextSize=CONTEXT, parallel=2)
            conn.close()

        run_async(load(), daemons=[cls.daemon])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def run_test(self, coro):
        return run_async(coro, daemons=[self.daemon])

    def test_greedy_equals_inferd_run(self):
        n = 24
        prompts = ["The capital of France is", "def fibonacci(n):"]
        expected = {p: harness.inferd_run(p, n, ctx=CONTEXT) for p in prompts}

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            for prompt, want in expected.items():
                out = await conn.generate(request(MODEL_ID, prompt, max_tokens=n, ignoreEog=False))
                self.assertCompleted(out, prompt)
                self.assertTextMatches(out, want, f"greedy text for {prompt!r} differs from inferd-run's")
                self.assertEqual(await conn.detokenize(MODEL_ID, out.tokens), out.text)
            conn.close()

        self.run_test(body())

    def test_chat_uses_gemma_turns(self):
        question = "What is the capital of France? Answer in one word."
        # The file stores no chat template: the daemon uses Gemma's turn format (what the prompt below spells
        # out for inferd-run, whose --chat knows only ChatML). gemma-3-270m is the pretrained model, not the
        # instruction-tuned one: its reply is what llama-completion gives for the same prompt, not an answer.
        formatted = f"<start_of_turn>user\n{question}<end_of_turn>\n<start_of_turn>model\n"
        want = harness.inferd_run(formatted, 32, ctx=CONTEXT)

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            info = {m.id: m for m in await conn.list()}[MODEL_ID]
            self.assertEqual(info.chatTemplate, "gemma")
            out = await conn.generate(request(MODEL_ID, messages=[{"role": "user", "content": question}],
                                              max_tokens=32))
            self.assertCompleted(out, "chat")
            self.assertTrue(out.text.strip(), f"no text: {out}")
            self.assertTextMatches(out, want, "chat output differs from inferd-run on the Gemma-formatted prompt")
            self.assertEqual(out.result.promptTokens, len(await conn.tokenize(MODEL_ID, formatted, True, True)))
            conn.close()

        self.run_test(body())

    def test_prompt_past_the_sliding_window(self):
        # 600+ tokens: past the 512-position window of the local layers. Greedy, so the daemon's text
        # equals the in-process engine's.
        prompt = " ".join(f"Item {i}: the number {i * 7 % 100}." for i in range(60)) + " Item 60:"
        want = harness.inferd_run(prompt, 12, ctx=CONTEXT)

        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            n_prompt = len(await conn.tokenize(MODEL_ID, prompt, True, True))
            self.assertGreater(n_prompt, 512)
            out = await conn.generate(request(MODEL_ID, prompt, max_tokens=12, ignoreEog=False))
            self.assertCompleted(out, "long prompt")
            self.assertEqual(out.result.promptTokens, n_prompt)
            self.assertTextMatches(out, want, "greedy text past the window differs from inferd-run's")
            conn.close()

        self.run_test(body())

    def test_tokenizer_through_the_api(self):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            # llama.cpp's ids for this text (tests/data/tokenizer/gemma3_refs.json has the full corpus).
            self.assertEqual(await conn.tokenize(MODEL_ID, "Hello world, this is a test.", True, True),
                             [2, 9259, 1902, 236764, 672, 563, 496, 1594, 236761])
            conn.close()

        self.run_test(body())


if __name__ == "__main__":
    harness.main()
