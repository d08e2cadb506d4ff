#!/usr/bin/env python3
"""End-to-end: OpenAI's HTTP API, with the official `openai` package as the client.

One daemon serves the API on its unix socket (next to the RPC socket, no key) and on a TCP loopback port
with a bearer key from a mode-0600 keys file. Checked: chat and completions, streamed and not; greedy
output equal to the Cap'n Proto API's for the same prompt; max_tokens, stop strings, a seed; usage;
errors as the SDK's typed exceptions (unknown model, bad values, a wrong key); bad input at the HTTP level
(malformed JSON, a 100 MB body, a slowloris client while a request is served, 200 idle connections from
one address: past the per-peer limit they are answered 429);
a client that disconnects mid-stream, or before a non-streamed answer, cancels its generation; /metrics
parses with Prometheus's own parser; a model named by a file in model-dirs loads on first use (requests
wait for it) and is unloaded after its keep-alive, which a request's keep_alive changes; embeddings
(through the SDK, base64 and float) agree with the model's own output layer: the output matrix applied
to a prompt's embedding ranks the next tokens as the logprobs of a completion of the same prompt do, to
within float rounding;
a TCP listener without keys, or with a keys file others can read, stops the daemon at start with the reason.

    test_openai.py --bin-dir BUILD/bin --model MODEL.gguf

Exits 77 (skipped) when the `openai` package is not installed (scripts/setup.sh installs it).
"""
import http.client
import json
import math
import os
import socket
import sys
import time

import harness
from harness import Connection, request, run_async

try:
    import openai
except ImportError:
    openai = None

MODEL = "smol"
CONTEXT = 512
KEY = "sk-inferd-e2e-0123456789"


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over the daemon's unix socket."""

    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def http_json(conn, method, path, body=None, headers=None):
    """(status, parsed JSON body) of one request."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read()
    return r.status, json.loads(raw) if raw else None


class OpenAiTest(harness.DaemonTestCase):

    @classmethod
    def setUpClass(cls):
        cls.port = free_port()
        cls.daemon = harness.Daemon("--http-listen", f"127.0.0.1:{cls.port}", "--http-keys", "KEYS", threads=2)
        keys = os.path.join(cls.daemon.dir, "keys")
        with open(keys, "w") as f:
            f.write(f"# keys of the e2e test\n{KEY}\n")
        os.chmod(keys, 0o600)
        cls.daemon.args[cls.daemon.args.index("KEYS")] = keys
        cls.daemon.start()
        cls.http_socket = os.path.join(cls.daemon.dir, "inferd-http.sock")

        async def load():
            conn = await Connection.open(cls.daemon.socket_path)
            await conn.load(harness.Config.model, id=MODEL, contextSize=CONTEXT, parallel=4)
            conn.close()

        run_async(load(), daemons=[cls.daemon])
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{cls.port}/v1", api_key=KEY, max_retries=0,
                                   timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def capnp_text(self, prompt, max_tokens):
        async def body():
            conn = await Connection.open(self.daemon.socket_path)
            out = await conn.generate(request(MODEL, prompt, max_tokens=max_tokens, temperature=0.0))
            conn.close()
            return out

        out = run_async(body(), daemons=[self.daemon])
        self.assertCompleted(out, "generate over Cap'n Proto")
        return out.text

    def test_completions_equal_the_capnp_api_greedy(self):
        prompt = "The capital of France is"
        want = self.capnp_text(prompt, 24)
        r = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 24)
        self.assertGreater(r.usage.prompt_tokens, 0)
        # Streamed: the same text, in pieces, then the finish reason and the usage.
        pieces, finish, usage = [], None, None
        for chunk in self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}):
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        self.assertEqual("".join(pieces), want)
        self.assertEqual(finish, "length")
        self.assertEqual(usage.completion_tokens, 24)

    def test_a_repeated_long_prompt_reports_its_cached_tokens(self):
        # The prefix cache through the SDK: the second request's full blocks come from the first's, the
        # answer is the same, and usage says how many prompt tokens were cached; cache_prompt=false opts out.
        prompt = "Here is a list of the fruits we sell at the market every Saturday morning: " * 8
        first = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        again = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
        self.assertEqual(again.choices[0].text, first.choices[0].text)
        cached = again.usage.prompt_tokens_details.cached_tokens
        self.assertGreaterEqual(cached, 64)
        self.assertEqual(cached % 64, 0)
        self.assertLess(cached, again.usage.prompt_tokens)
        off = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                             extra_body={"cache_prompt": False})
        self.assertEqual(off.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(off.choices[0].text, first.choices[0].text)

    def test_chat_streamed_and_not(self):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Name three colours."}]
        whole = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
        text = whole.choices[0].message.content
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertTrue(text, "an empty answer")
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens)
        pieces, roles = [], []
        for chunk in self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                                        temperature=0, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.choices and chunk.choices[0].delta.role:
                roles.append(chunk.choices[0].delta.role)
        self.assertEqual("".join(pieces), text, "the streamed chat differs from the whole one")
        self.assertEqual(roles, ["assistant"])

    def test_stop_max_tokens_and_seed(self):
        r = self.client.completions.create(model=MODEL, prompt="One, two, three, four,", max_tokens=40,
                                           temperature=0, stop=[","])
        self.assertNotIn(",", r.choices[0].text)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=20,
                      temperature=0.9, seed=1234)
        a = self.client.chat.completions.create(**kwargs).choices[0].message.content
        b = self.client.chat.completions.create(**kwargs).choices[0].message.content
        self.assertEqual(a, b, "the same seed gave different samples")

    def test_errors_are_the_sdks_typed_exceptions(self):
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        self.assertIn("no-such-model", str(e.exception))
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], top_p=3)
        self.assertIn("top_p", str(e.exception))
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                extra_body={"temperature": "hot"})
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                logprobs=True, top_logprobs=21)
        self.assertIn("top_logprobs", str(e.exception))
        wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="sk-wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            wrong.models.list()
        self.assertEqual([m.id for m in self.client.models.list()], [MODEL])

    def test_unix_socket_needs_no_key(self):
        conn = UnixHTTPConnection(self.http_socket)
        self.assertEqual(http_json(conn, "GET", "/health"), (200, {"status": "ok"}))
        status, body = http_json(conn, "GET", "/v1/models")
        self.assertEqual((status, [m["id"] for m in body["data"]]), (200, [MODEL]))
        status, body = http_json(conn, "POST", "/v1/completions",
                                 {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["completion_tokens"], 4)
        conn.close()

    def test_bad_input_gets_clear_errors_and_the_daemon_keeps_serving(self):
        conn = UnixHTTPConnection(self.http_socket)
        status, body = http_json(conn, "POST", "/v1/chat/completions", b"{not json")
        self.assertEqual(status, 400)
        self.assertIn("not valid JSON", body["error"]["message"])
        status, body = http_json(conn, "POST", "/v1/chat/completions", {"model": MODEL, "messages": "hi"})
        self.assertEqual(status, 400)
        self.assertIn("messages", body["error"]["message"])
        status, body = http_json(conn, "GET", "/v1/chat/completions")
        self.assertEqual(status, 405)
        status, body = http_json(conn, "GET", "/v2/anything")
        self.assertEqual(status, 404)
        conn.close()
        # A 100 MB body: refused from its Content-Length, before it is read.
        big = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        big.settimeout(30)
        big.connect(self.http_socket)
        big.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000000\r\n\r\n" + b"{" * 65536)
        reply = big.recv(4096)
        big.close()
        self.assertIn(b" 413 ", reply.split(b"\r\n")[0])
        # A client sending its headers a byte at a time does not hold up a request on another connection.
        slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        slow.connect(("127.0.0.1", self.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHo")
        t0 = time.monotonic()
        r = self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 4)
        self.assertLess(time.monotonic() - t0, 30)
        # 200 idle connections from one address: past http-connections-per-peer (64) each is answered 429,
        # and so is this client's next one while they stay open; the daemon keeps serving the unix socket,
        # and the address again once they close.
        idle = []
        for _ in range(200):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.connect(("127.0.0.1", self.port))
            idle.append(s)
        harness.wait_until(lambda: "http-connections-per-peer" in self.daemon.log(), 30, "connections to be refused")
        with self.assertRaises(openai.RateLimitError):  # a new connection (the shared client's stays served)
            self.fresh_client().completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
        conn = UnixHTTPConnection(self.http_socket)
        self.assertEqual(http_json(conn, "GET", "/health")[0], 200)
        conn.close()
        for s in idle + [slow]:
            s.close()
        harness.wait_until(lambda: self._answers_tcp(), 30, "the address to be served again")

    def fresh_client(self):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=KEY, max_retries=0, timeout=120)

    def _answers_tcp(self):
        try:
            return self.fresh_client().completions.create(model=MODEL, prompt="Hi", max_tokens=2,
                                                          temperature=0).usage.completion_tokens == 2
        except openai.RateLimitError:
            return False

    def test_metrics_are_prometheus_text(self):
        try:
            from prometheus_client.parser import text_string_to_metric_families
        except ImportError:
            self.skipTest("prometheus-client is not installed (pip install prometheus-client)")
        r = self.client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 3)
        conn = UnixHTTPConnection(self.http_socket)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertTrue(resp.getheader("Content-Type").startswith("text/plain; version=0.0.4"))
        text = resp.read().decode()
        conn.close()
        families = {f.name: f for f in text_string_to_metric_families(text)}

        def value(name, **labels):
            for f in families.values():
                for s in f.samples:
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                        return s.value
            self.fail(f"no sample {name} {labels} in /metrics:\n{text}")

        self.assertGreaterEqual(value("inferd_requests_total", model=MODEL, outcome="completed"), 1)
        self.assertGreaterEqual(value("inferd_generated_tokens_total", model=MODEL), 3)
        self.assertGreaterEqual(value("inferd_time_to_first_token_seconds_count", model=MODEL), 1)
        self.assertEqual(value("inferd_model_state", model=MODEL, state="ready"), 1)
        self.assertEqual(value("inferd_kv_slots", model=MODEL), 4)
        self.assertEqual(families["inferd_time_per_output_token_seconds"].type, "histogram")

    def test_a_client_that_disconnects_mid_stream_cancels_its_generation(self):
        conn = UnixHTTPConnection(self.http_socket)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}),
            headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        first = r.readline()
        self.assertTrue(first.startswith(b"data: "), first)
        conn.sock.shutdown(socket.SHUT_RDWR)
        r.close()
        conn.close()
        harness.wait_until(lambda: "cancelled by the client" in self.daemon.log(), 60,
                           "the daemon to cancel the abandoned stream")

    def test_logprobs_follow_the_text_and_are_a_distribution(self):
        r = self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                                max_tokens=12, temperature=0, logprobs=True, top_logprobs=4)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)
            self.assertEqual(len(t.top_logprobs), 4)
            lps = [a.logprob for a in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            self.assertLessEqual(sum(math.exp(x) for x in lps), 1.0 + 1e-4)
            # Greedy, no penalties: the sampled token is the most likely one.
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
        # Streamed: the same entries, chunk by chunk.
        streamed = []
        for chunk in self.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                                         max_tokens=12, temperature=0, logprobs=True, top_logprobs=4,
                                                         stream=True):
            if chunk.choices and chunk.choices[0].logprobs:
                streamed += chunk.choices[0].logprobs.content
        self.assertEqual([(t.token, round(t.logprob, 5)) for t in streamed],
                         [(t.token, round(t.logprob, 5)) for t in content])
        # Completions: the legacy shape, offsets into the text.
        c = self.client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6,
                                           temperature=0, logprobs=2)
        lp = c.choices[0].logprobs
        self.assertEqual("".join(lp.tokens), c.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset[1], len(lp.tokens[0].encode()))
        self.assertTrue(all(len(t) <= 2 for t in lp.top_logprobs))

    def test_embeddings_rank_the_next_token_as_the_model_does(self):
        import numpy as np
        import gguf

        prompt = "The capital of France is"
        e = self.client.embeddings.create(model=MODEL, input=prompt)  # the SDK asks for base64 by default
        vec = np.array(e.data[0].embedding, dtype=np.float64)
        self.assertEqual(vec.shape, (576,))  # SmolLM2-135M's hidden size
        self.assertAlmostEqual(float(np.linalg.norm(vec)), 1.0, places=5)
        self.assertGreater(e.usage.prompt_tokens, 0)
        # The same text as floats, several inputs at once (one of them token ids): same vectors, in order.
        toks = run_async(self._tokenize(prompt), daemons=[self.daemon])
        conn = UnixHTTPConnection(self.http_socket)
        status, body = http_json(conn, "POST", "/v1/embeddings",
                                 {"model": MODEL, "input": ["hello there", prompt, toks], "encoding_format": "float"})
        conn.close()
        self.assertEqual(status, 200, body)
        self.assertEqual([d["index"] for d in body["data"]], [0, 1, 2])
        np.testing.assert_allclose(body["data"][1]["embedding"], vec, atol=1e-6)
        np.testing.assert_allclose(body["data"][2]["embedding"], vec, atol=1e-6)
        self.assertLess(float(np.dot(body["data"][0]["embedding"], vec)), 0.999)
        # The output layer applied to the embedding gives the logits up to a positive scale (the norm):
        # its ranking and log-probability differences are a completion's.
        reader = gguf.GGUFReader(harness.Config.model)
        t = {x.name: x for x in reader.tensors}
        w = t.get("output.weight") or t["token_embd.weight"]
        W = gguf.quants.dequantize(w.data, w.tensor_type).reshape(-1, 576).astype(np.float64)
        # The CPU engine multiplies by a Q8_0 weight with its input quantized to Q8_0 too (per block of
        # 32, a scale per block, so the same for the normalized vector), as llama.cpp does.
        q = gguf.quants.quantize(vec.astype(np.float32).reshape(1, -1), gguf.GGMLQuantizationType.Q8_0)
        z = W @ gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(-1).astype(np.float64)
        c = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=5)
        top = c.choices[0].logprobs.top_logprobs[0]  # token text -> logprob, best first
        order = [int(i) for i in np.argsort(-z)[:5]]
        pieces = run_async(self._pieces(order), daemons=[self.daemon])
        self.assertEqual(pieces[0], c.choices[0].logprobs.tokens[0])
        lps = [top[p] for p in pieces]
        scale = (lps[0] - lps[4]) / (z[order[0]] - z[order[4]])
        for k in (1, 2, 3):
            self.assertAlmostEqual(lps[0] - lps[k], scale * (z[order[0]] - z[order[k]]), delta=2e-3)
        # Bad input: a clear 400; a model that is not there: 404.
        with self.assertRaises(openai.BadRequestError):
            self.client.embeddings.create(model=MODEL, input="x", dimensions=8)
        with self.assertRaises(openai.NotFoundError):
            self.client.embeddings.create(model="no-such-model", input="x")

    async def _tokenize(self, text):
        conn = await Connection.open(self.daemon.socket_path)
        out = await conn.tokenize(MODEL, text, add_special=True, parse_special=True)
        conn.close()
        return out

    async def _pieces(self, ids):
        conn = await Connection.open(self.daemon.socket_path)
        out = [await conn.detokenize(MODEL, [i]) for i in ids]
        conn.close()
        return out

    def test_a_client_that_disconnects_before_the_answer_cancels_its_generation(self):
        before = self.daemon.log().count("cancelled by the client")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.http_socket)
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0,
                           "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)

        async def active():
            conn = await Connection.open(self.daemon.socket_path)
            m = await conn.model_status(MODEL)
            conn.close()
            return m.requestsActive

        # The generation holds a slot before the client goes (no answer is written before its end).
        harness.wait_until(lambda: run_async(active(), daemons=[self.daemon]) >= 1, 60, "the request to start")
        s.close()
        harness.wait_until(lambda: self.daemon.log().count("cancelled by the client") > before, 60,
                           "the daemon to cancel the abandoned non-streamed request")
        harness.wait_until(lambda: run_async(active(), daemons=[self.daemon]) == 0, 60, "its slot to be free")
        self.assertNotIn("+ 400 generated tokens", self.daemon.log())

    def test_a_client_that_stops_reading_is_cut_off_and_the_daemon_keeps_serving(self):
        d = harness.Daemon("--stream-stall-timeout", "1", threads=2)
        d.start()
        self.addCleanup(d.stop)

        async def load():
            conn = await Connection.open(d.socket_path)
            await conn.load(harness.Config.model, id=MODEL, contextSize=CONTEXT, parallel=2)
            conn.close()

        run_async(load(), daemons=[d])
        http_socket = os.path.join(d.dir, "inferd-http.sock")
        # A stream of ~1.5 KB per token (20 alternatives each) that the client never reads: the socket's
        # buffers fill, the daemon's write waits, and after stream-stall-timeout the stream is cut off.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(http_socket)
        body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0,
                           "ignore_eos": True, "stream": True, "logprobs": 20}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        harness.wait_until(lambda: "has not read for" in d.log(), 120, "the daemon to cut off the client that stopped reading")
        received = b""
        s.settimeout(30)
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            received += chunk
        s.close()
        self.assertTrue(received.startswith(b"HTTP/1.1 200"), received[:100])
        self.assertNotIn(b"data: [DONE]", received)
        # Meanwhile and after, the daemon serves others.
        conn = UnixHTTPConnection(http_socket)
        status, out = http_json(conn, "POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2})
        conn.close()
        self.assertEqual(status, 200, out)

    def test_models_by_name_load_on_first_use_and_unload_when_idle(self):
        d = harness.Daemon("--model-dirs", "DIR", "--keep-alive", "2", threads=2)
        models = os.path.join(d.dir, "models")
        os.mkdir(models)
        os.symlink(harness.Config.model, os.path.join(models, "smollm2.gguf"))
        d.args[d.args.index("DIR")] = models
        d.start()
        self.addCleanup(d.stop)
        socket_path = os.path.join(d.dir, "inferd-http.sock")
        # Two requests for the model by name while it loads: both wait for the load and complete.
        import concurrent.futures

        def ask(n):
            conn = UnixHTTPConnection(socket_path, timeout=120)
            status, body = http_json(conn, "POST", "/v1/completions",
                                     {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": n,
                                      "temperature": 0})
            conn.close()
            return status, body

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(ask, [4, 5]))
        for (status, body), n in zip(results, [4, 5]):
            self.assertEqual(status, 200, body)
            self.assertEqual(body["usage"]["completion_tokens"], n)
        self.assertIn("requested by name", d.log())
        # A name that is no file there is still a 404.
        conn = UnixHTTPConnection(socket_path)
        status, body = http_json(conn, "POST", "/v1/completions", {"model": "nothing", "prompt": "x"})
        conn.close()
        self.assertEqual(status, 404, body)
        self.assertIn("model-dirs", body["error"]["message"])

        async def listed():
            conn = await Connection.open(d.socket_path)
            out = [(m.id, m.keepAliveS, m.unloadInS) for m in await conn.list()]
            conn.close()
            return out

        (mid, keep, left), = run_async(listed(), daemons=[d])
        self.assertEqual((mid, keep), ("smollm2", 2.0))
        self.assertLessEqual(left, 2.0)
        # Idle past its keep-alive: unloaded; asked again: loaded again.
        harness.wait_until(lambda: not run_async(listed(), daemons=[d]), 30, "the idle model to be unloaded")
        self.assertIn("idle for its keep-alive", d.log())
        self.assertEqual(ask(3)[0], 200)
        # A request's keep_alive (ollama's) changes a by-name model's: 0 keeps it, then "1s" lets it go.
        conn = UnixHTTPConnection(socket_path, timeout=120)
        status, body = http_json(conn, "POST", "/v1/completions",
                                 {"model": "smollm2", "prompt": "Hi", "max_tokens": 1, "keep_alive": 0})
        self.assertEqual(status, 200, body)
        (mid, keep, left), = run_async(listed(), daemons=[d])
        self.assertEqual((keep, left), (0.0, -1.0))
        status, body = http_json(conn, "POST", "/v1/embeddings", {"model": "smollm2", "input": "Hi", "keep_alive": "1s"})
        conn.close()
        self.assertEqual(status, 200, body)
        harness.wait_until(lambda: not run_async(listed(), daemons=[d]), 30, "the model to go after its new keep-alive")

    def test_tcp_without_keys_or_with_a_readable_keys_file_does_not_start(self):
        d = harness.Daemon("--http-listen", f"127.0.0.1:{free_port()}")
        with self.assertRaises(AssertionError) as e:
            d.start()
        self.assertIn("http-keys", str(e.exception))
        d.stop()
        d = harness.Daemon("--http-listen", f"127.0.0.1:{free_port()}", "--http-keys", "KEYS")
        keys = os.path.join(d.dir, "keys")
        with open(keys, "w") as f:
            f.write(KEY + "\n")
        os.chmod(keys, 0o644)
        d.args[d.args.index("KEYS")] = keys
        with self.assertRaises(AssertionError) as e:
            d.start()
        self.assertIn("0600", str(e.exception))
        d.stop()


if __name__ == "__main__":
    if openai is None and "--help" not in sys.argv:
        print("SKIP: the openai package is not installed (pip install openai)", file=sys.stderr)
        sys.exit(harness.SKIP_RETURN_CODE)
    harness.main()
