"""Shared machinery of inferd's end-to-end tests: real daemon processes, a pycapnp client, /proc probes.

Every test file is a plain `unittest` module run as

    python3 tests/e2e/test_x.py --bin-dir BUILD/bin --model MODEL.gguf [--inferd-run PATH] [unittest args]

and ends with `harness.main()`, which exits 77 (ctest's SKIP_RETURN_CODE) when pycapnp is not installed
or the model file is missing, so a machine without them skips instead of failing.

Concurrency: pycapnp runs Cap'n Proto's event loop inside asyncio (`capnp.run`). All RPC work of a test
happens inside one `run_async()` call on the test's thread; nothing here is shared between threads.
Synchronization with the daemon is by polling a condition with a deadline, never by a fixed sleep.
"""
import argparse
import asyncio
import functools
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import capnp
except ImportError as e:  # reported by main(): the tests are skipped, not failed
    capnp = None
    _CAPNP_IMPORT_ERROR = e

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCHEMA_PATH = os.path.join(SOURCE_DIR, "schemas", "inferd.capnp")
SKIP_RETURN_CODE = 77

# Bounds for polling. Generous: the suite shares 2 cores with whatever else runs.
SOCKET_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
POLL_INTERVAL_S = 0.02

# Streams are checked strictly: every generated token reaches the sink, in order. (pycapnp runs each
# send() as its own task, so the daemon's TokenSink.done() barrier, which the sink implements, is what
# guarantees that the last batch is handled before generate returns; BasicTest.test_final_batch_delivered
# pins it.)
stream_stats = {"streams": 0}


class Config:
    """Command-line settings, filled in by main() before the tests run."""
    bin_dir = None
    model = None
    inferd_run = None
    threads = 1  # compute threads of workers and of inferd-run: same numerics, kind to a small machine


# ------------------------------------------------------------------------------------------------
# Schema and client-side capability servers (built on first use, so that importing this module works
# without pycapnp and main() can report the skip).

@functools.cache
def schema():
    return capnp.load(SCHEMA_PATH, imports=["/usr/include"])


@functools.cache
def _sink_class():
    class CollectingSink(schema().TokenSink.Server):
        """Collects every streamed batch. `on_batch(sink)` (async, optional) runs after each batch; a
        test uses it to act mid-stream (kill a worker, drop the connection)."""

        def __init__(self, on_batch=None):
            self.tokens = []
            self.text = ""
            self.batches = 0
            self.on_batch = on_batch

        async def send(self, batch, **kwargs):
            self.tokens.extend(batch.tokens)
            self.text += batch.text
            self.batches += 1
            if self.on_batch is not None:
                await self.on_batch(self)

        async def done(self, **kwargs):
            pass  # the daemon's barrier: every send() above has been handled

    return CollectingSink


@functools.cache
def _progress_class():
    class CollectingProgress(schema().LoadProgress.Server):
        def __init__(self):
            self.updates = []  # (stage, done, total)

        async def update(self, stage, done, total, **kwargs):
            self.updates.append((stage, done, total))

    return CollectingProgress


def make_sink(on_batch=None):
    return _sink_class()(on_batch)


def make_progress():
    return _progress_class()()


# ------------------------------------------------------------------------------------------------
# Processes and /proc

def process_gone(pid):
    """True when `pid` no longer runs: no /proc entry, or a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    # The state follows the parenthesized command name, which may itself contain ") ".
    return stat[stat.rindex(")") + 2] in "ZX"


def process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def children(pid):
    """Pids of the live child processes of `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] not in "ZX":
            out.append(int(entry))
    return out


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_targets(pid):
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return out


def mapped_paths(pid):
    """The file names in /proc/PID/maps (memfds show as "/memfd:NAME (deleted)")."""
    paths = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                paths.add(parts[5].strip())
    return paths


def dev_shm_listing():
    try:
        return sorted(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return []


def wait_until(predicate, timeout_s, what):
    """Polls predicate() until it is true; fails with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


async def wait_until_async(predicate, timeout_s, what):
    """Async version: `predicate` returns a value or an awaitable of it; the first truthy value is
    returned. The event loop keeps running between polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


# ------------------------------------------------------------------------------------------------
# The daemon

class Daemon:
    """One `inferd` process on a socket in its own temporary directory, its log in that directory.

    Use as a context manager or call start()/stop(). The directory is removed by stop() unless the
    daemon failed to stop cleanly (then its log stays for inspection and its path is in the error)."""

    def __init__(self, *args, env=None, socket_path=None, threads=None, fault=None):
        """`fault`: run the test worker inferd-fault-worker with INFERD_TEST_WORKER_FAULT=fault
        ("start": every worker aborts before ready; "step:N": each worker fails its N-th step)."""
        self.dir = tempfile.mkdtemp(prefix="inferd-e2e-")
        self.socket_path = socket_path or os.path.join(self.dir, "inferd.sock")
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.args = list(args)
        self.env = dict(os.environ)
        self.env.pop("INFERD_TEST_WORKER_FAULT", None)
        self.env.pop("NOTIFY_SOCKET", None)
        self.env.pop("LISTEN_FDS", None)
        if env:
            self.env.update(env)
        if fault:
            self.env["INFERD_TEST_WORKER_FAULT"] = fault
            self.args += ["--worker", os.path.join(Config.bin_dir, "inferd-fault-worker")]
        self.threads = Config.threads if threads is None else threads
        self.proc = None

    @property
    def pid(self):
        return self.proc.pid

    def command(self):
        return [os.path.join(Config.bin_dir, "inferd"), "--socket", self.socket_path,
                "--threads", str(self.threads)] + self.args

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + SOCKET_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"inferd exited with status {self.proc.returncode} before serving "
                                     f"{self.socket_path}\n{self.log_tail()}")
            if self._answers():
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"inferd did not serve {self.socket_path} within {SOCKET_TIMEOUT_S:.0f} s\n"
                                     f"{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def _answers(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket_path)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def stop(self, remove_dir=True):
        """SIGTERM, then waits (bounded) for the exit; returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"inferd did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM; "
                                     f"log kept in {self.log_path}\n{self.log_tail()}")
        rc = self.proc.returncode
        if remove_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def kill9(self):
        """SIGKILL and reap; the socket file and temporary directory stay."""
        self.proc.kill()
        self.proc.wait()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def log_tail(self, lines=40):
        tail = self.log().splitlines()[-lines:]
        return f"--- inferd log ({self.log_path}), last {len(tail)} lines ---\n" + "\n".join(tail)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


# ------------------------------------------------------------------------------------------------
# A client connection

class Outcome:
    """What a generate call produced: the streamed tokens/text, and either the result or the error."""

    def __init__(self, sink, result=None, error=None):
        self.tokens = list(sink.tokens)
        self.text = sink.text
        self.batches = sink.batches
        self.result = result
        self.error = error

    def __repr__(self):
        end = f"error={self.error.type}: {self.error.description}" if self.error else \
            f"finish={self.result.finishReason} generated={self.result.generatedTokens} replays={self.result.replays}"
        return f"Outcome({len(self.tokens)} tokens, {end}, text={self.text!r})"


class Connection:
    """One connection to the daemon with its Daemon, Inference and Admin capabilities."""

    @classmethod
    async def open(cls, socket_path, name="inferd-e2e"):
        self = cls()
        self.stream = await capnp.AsyncIoStream.create_unix_connection(socket_path)
        self.client = capnp.TwoPartyClient(self.stream)
        self.daemon = self.client.bootstrap().cast_as(schema().Daemon)
        self.hello = await self.daemon.hello(schema().protocolVersion, name)
        self.inference = (await self.daemon.inference()).inference
        self.admin = (await self.daemon.admin()).admin
        return self

    def close(self):
        """Closes the socket: the daemon sees the client go away (TwoPartyClient.close() alone
        leaves the socket open)."""
        self.client.close()
        self.stream.close()

    async def load(self, path, progress=None, **options):
        if progress is None:
            return (await self.admin.load(path=path, options=options)).model
        return (await self.admin.load(path=path, options=options, progress=progress)).model

    async def unload(self, model_id):
        await self.admin.unload(model_id)

    async def status(self):
        return (await self.admin.status()).status

    async def model_status(self, model_id):
        """The model's ModelStatus, or None when it is not loaded."""
        for m in (await self.status()).models:
            if m.info.id == model_id:
                return m
        return None

    async def worker_pid(self, model_id):
        m = await self.model_status(model_id)
        assert m is not None, f"model {model_id} is not in status()"
        assert len(m.info.workers) == 1, f"expected one worker, status says {m.info.workers}"
        return m.info.workers[0].pid

    async def list(self):
        return (await self.inference.list()).models

    async def tokenize(self, model_id, text, add_special=False, parse_special=False):
        return list((await self.inference.tokenize(model_id, text, add_special, parse_special)).tokens)

    async def detokenize(self, model_id, tokens):
        return (await self.inference.detokenize(model_id, tokens)).text

    def start_generate(self, request, on_batch=None):
        """Sends a generate now (calls on one connection reach the daemon in the order they are
        sent) and returns an asyncio task that resolves to its Outcome. Cap'n Proto errors are
        returned in the Outcome, for the test to assert on; anything else propagates."""
        sink = make_sink(on_batch)
        call = self.inference.generate(request, sink)

        async def outcome():
            try:
                return Outcome(sink, result=(await call).result)
            except capnp.KjException as e:
                return Outcome(sink, error=e)

        return asyncio.ensure_future(outcome())

    async def generate(self, request, on_batch=None):
        return await self.start_generate(request, on_batch)


def request(model, prompt=None, max_tokens=16, temperature=0.0, seed=None, messages=None, tokens=None,
            **extra):
    """A GenerateRequest as a dict (pycapnp fills the struct from it)."""
    r = {"model": model, "maxTokens": max_tokens}
    if messages is not None:
        r["input"] = {"messages": messages}
    elif tokens is not None:
        r["input"] = {"tokens": tokens}
    else:
        r["input"] = {"prompt": prompt}
    sampling = {"temperature": temperature}
    if seed is not None:
        sampling["seed"] = seed
    sampling.update(extra.pop("sampling", {}))
    r["sampling"] = sampling
    r.update(extra)
    return r


def run_async(coro, daemons=()):
    """Runs `coro` on a fresh asyncio + KJ event loop. On failure the logs of `daemons` are attached
    to the exception, so a failing test shows what the daemon said."""
    try:
        return asyncio.run(capnp.run(coro))
    except BaseException as e:
        for d in daemons:
            if d is not None and hasattr(e, "add_note"):
                e.add_note(d.log_tail())
        raise


class DaemonTestCase(unittest.TestCase):
    """Base class with assertion helpers for Cap'n Proto errors and generate outcomes."""

    def assertKjError(self, error, kind, *fragments, context=""):
        """`error` is a capnp.KjException of type `kind` whose description contains every fragment
        (case-insensitive)."""
        self.assertIsNotNone(error, f"{context}: expected a {kind} error, the call succeeded")
        self.assertIsInstance(error, capnp.KjException, context)
        self.assertEqual(error.type, kind, f"{context}: wrong error type; description: {error.description}")
        for f in fragments:
            self.assertIn(f.lower(), error.description.lower(),
                          f"{context}: the error should mention {f!r}: {error.description}")

    async def expect_error(self, awaitable, kind, *fragments, context=""):
        try:
            value = await awaitable
        except capnp.KjException as e:
            self.assertKjError(e, kind, *fragments, context=context)
            return e
        self.fail(f"{context}: expected a {kind} error, got {value}")

    def assertCompleted(self, outcome, context=""):
        """The generate ended with a result, and generatedTokens equals the tokens received."""
        self.assertIsNone(outcome.error, f"{context}: generate failed: {outcome}")
        stream_stats["streams"] += 1
        self.assertEqual(outcome.result.generatedTokens, len(outcome.tokens),
                         f"{context}: generatedTokens differs from the number of streamed tokens: {outcome}")

    def assertStreamMatches(self, outcome, expected_tokens, context=""):
        """The generate completed and streamed exactly `expected_tokens`: no token missing, duplicated
        or different."""
        self.assertCompleted(outcome, context)
        self.assertEqual(outcome.result.generatedTokens, len(expected_tokens),
                         f"{context}: generatedTokens is not the expected count: {outcome}")
        self.assertEqual(outcome.tokens, list(expected_tokens),
                         f"{context}: the streamed tokens differ from the reference {list(expected_tokens)}")

    def assertTextMatches(self, outcome, expected_text, context=""):
        """The streamed text is `expected_text`."""
        self.assertEqual(outcome.text, expected_text, context)


def copy_model(directory):
    """A private copy of the model (tests that delete it or check it is not re-read use it)."""
    dst = os.path.join(directory, "model-copy.gguf")
    shutil.copyfile(Config.model, dst)
    return dst


def inferd_run(prompt, n_predict, chat=False, system=None, ctx=512):
    """Greedy text from the in-process engine (tools/inferd-run): only the generated part."""
    cmd = [Config.inferd_run, "-m", Config.model, "-p", prompt, "-n", str(n_predict), "--temp", "0",
           "-t", str(Config.threads), "-c", str(ctx), "-s", "1", "-q"]
    if chat:
        cmd.append("--chat")
        if system is not None:
            cmd += ["--system", system]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.decode(errors='replace')}")
    text = out.stdout.decode("utf-8")
    # inferd-run echoes a plain prompt first and ends with a newline of its own.
    assert text.endswith("\n"), repr(text)
    text = text[:-1]
    if not chat:
        assert text.startswith(prompt), (prompt, text)
        text = text[len(prompt):]
    return text


# ------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="directory with inferd and inferd-worker")
    parser.add_argument("--model", required=True, help="GGUF model (the default SmolLM2-135M)")
    parser.add_argument("--inferd-run", help="tools/inferd-run (default: BIN_DIR/../tools/inferd-run)")
    args, rest = parser.parse_known_args()
    if capnp is None:
        print(f"SKIP: pycapnp is not installed ({_CAPNP_IMPORT_ERROR}); pip install pycapnp", file=sys.stderr)
        sys.exit(SKIP_RETURN_CODE)
    if not os.path.isfile(args.model):
        print(f"SKIP: model file {args.model} is missing", file=sys.stderr)
        sys.exit(SKIP_RETURN_CODE)
    Config.bin_dir = os.path.abspath(args.bin_dir)
    Config.model = os.path.abspath(args.model)
    Config.inferd_run = os.path.abspath(args.inferd_run or os.path.join(Config.bin_dir, "..", "tools", "inferd-run"))
    for exe in ("inferd", "inferd-worker"):
        path = os.path.join(Config.bin_dir, exe)
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is missing or not executable (build the inferd and inferd-worker targets)")
    started = time.monotonic()
    program = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    print(f"{stream_stats['streams']} streams checked", file=sys.stderr)
    print(f"wall time: {time.monotonic() - started:.1f} s", file=sys.stderr)
    sys.exit(0 if program.result.wasSuccessful() else 1)
