#!/usr/bin/env python3
"""An inferd client written from schemas/inferd.capnp alone, with pycapnp (no inferd code).

Loads a model, streams a greedy generation, prints it, checks the result's bookkeeping, unloads.
Proof that the API is usable without libinferd-client. Exit status 0 on success.

    pycapnp_client.py SOCKET MODEL_PATH [PROMPT]
"""
import asyncio
import os
import sys

import capnp

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas", "inferd.capnp")
inferd = capnp.load(SCHEMA, imports=["/usr/include"])


class Sink(inferd.TokenSink.Server):
    def __init__(self):
        self.tokens = []
        self.text = ""
        self.batches = 0

    async def send(self, batch, **kwargs):
        self.tokens.extend(batch.tokens)
        self.text += batch.text
        self.batches += 1

    async def done(self, **kwargs):
        pass  # the barrier: every send() above has run before generate returns


class Progress(inferd.LoadProgress.Server):
    def __init__(self):
        self.updates = []

    async def update(self, stage, done, total, **kwargs):
        self.updates.append((stage, done, total))


async def main(socket_path, model_path, prompt):
    stream = await capnp.AsyncIoStream.create_unix_connection(socket_path)
    client = capnp.TwoPartyClient(stream)
    daemon = client.bootstrap().cast_as(inferd.Daemon)
    hello = await daemon.hello(inferd.protocolVersion, "pycapnp-test")
    assert hello.protocolVersion == inferd.protocolVersion, hello
    admin = (await daemon.admin()).admin
    inference = (await daemon.inference()).inference

    progress = Progress()
    loaded = await admin.load(model_path, {"id": "py-smollm", "parallel": 2, "contextSize": 512}, progress)
    assert loaded.model.id == "py-smollm" and loaded.model.state == "ready", loaded.model
    assert progress.updates, "no load progress was reported"

    sink = Sink()
    request = {"model": "py-smollm", "input": {"prompt": prompt}, "maxTokens": 24,
               "sampling": {"temperature": 0.0}}
    result = (await inference.generate(request, sink)).result
    assert result.generatedTokens == len(sink.tokens), (result.generatedTokens, len(sink.tokens))
    assert result.finishReason in ("maxTokens", "endOfGeneration"), result.finishReason
    detok = (await inference.detokenize("py-smollm", sink.tokens)).text
    assert detok.startswith(sink.text) or sink.text.startswith(detok), (detok, sink.text)
    print(f"{len(sink.tokens)} tokens in {sink.batches} batches, finish={result.finishReason}, "
          f"ttft={result.timeToFirstTokenMs:.1f} ms")
    print(sink.text)

    try:  # bad input gets a clear error, and the daemon keeps serving
        await inference.generate({"model": "no-such-model", "input": {"prompt": "x"}}, Sink())
        raise AssertionError("an unknown model was accepted")
    except capnp.KjException as e:
        assert "no-such-model" in str(e), e

    await admin.unload("py-smollm")
    models = (await admin.list()).models
    assert all(m.id != "py-smollm" for m in models), models


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    prompt = sys.argv[3] if len(sys.argv) > 3 else "The capital of France is"
    asyncio.run(capnp.run(main(sys.argv[1], sys.argv[2], prompt)))
