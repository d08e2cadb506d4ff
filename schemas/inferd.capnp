# inferd's public API (protocol version 1).
#
# A client connects to the daemon's unix socket and gets the bootstrap capability `Daemon`. From it
# it asks for `Inference` (tokenize, generate, list) and, separately, `Admin` (load, unload, status),
# so that a deployment can hand out one without the other.
#
# Errors are Cap'n Proto exceptions whose type tells the client what to do:
#   FAILED        the request is wrong (bad path, unknown model, invalid sampling value, prompt longer
#                 than the context, ...): the description says what; retrying will not help.
#   OVERLOADED    the admission queue is full: back off and retry.
#   DISCONNECTED  the worker running the request died and the request could not be replayed: retry.
#   UNIMPLEMENTED the daemon does not support what was asked (e.g. a backend it was built without).
#
# Streaming: `generate` pushes tokens to the caller's `TokenSink` with flow-controlled `-> stream`
# calls, in batches of whatever is ready when the previous batch was acknowledged, so a slow client
# never costs one round trip per token. Cancelling = dropping the `generate` call (or disconnecting):
# the sequence is stopped and its KV slot freed at the next step.

@0xea6f8faaa1b50c4c;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("inferd::rpc");

const protocolVersion :UInt32 = 1;

interface Daemon {
  hello @0 (clientProtocol :UInt32, clientName :Text)
        -> (protocolVersion :UInt32, daemonVersion :Text, pid :UInt32);
  # Fails with FAILED if the client's major protocol version is not served.

  inference @1 () -> (inference :Inference);
  admin @2 () -> (admin :Admin);
  # Refused (FAILED, "permission denied") when the daemon runs with admin calls restricted to
  # peers whose uid is in its admin list.
}

# ------------------------------------------------------------------------------------------------
# Models

struct LoadOptions {
  id @0 :Text;              # model id used by later calls; empty: the file name without ".gguf"
  contextSize @1 :UInt32;   # tokens per sequence; 0: min(training context, 4096)
  parallel @2 :UInt32;      # sequences in flight at once (KV slots); 0: 4
  threads @3 :UInt32;       # compute threads of a CPU worker; 0: the daemon's default
  backend @4 :Text;         # "cpu" (default); "cuda" / "opencl" where built and present
  batchTokens @5 :UInt32;   # most tokens in one forward pass; 0: 512
  padStep @6 :UInt32;       # decode shapes are padded to multiples of this (64 or 128); 0: 64
  maxQueue @7 :UInt32;      # requests waiting for a slot before OVERLOADED; 0: 64
  layerSplit @8 :List(UInt32);
  # Pipeline placement, like llama.cpp's -ngl: the first layer of each worker after the first. Empty:
  # one worker runs every layer. [15] on a 30-layer model: worker 0 runs layers 0-14 (and the
  # embeddings), worker 1 layers 15-29 (and the output); hidden states pass between them through shared
  # memory.
  stageBackends @9 :List(Text);
  # One backend per pipeline stage, in order ("cpu", "opencl", "opencl:1", ...), e.g. ["opencl", "cpu"]
  # with layerSplit [15]: the first 15 layers on the GPU, the rest on the CPU (llama.cpp's -ngl). Empty:
  # every stage uses `backend`. Otherwise its length must be layerSplit's plus one (INVALID_ARGUMENT).
  keepAliveS @10 :Float64;  # unload after this many seconds without a request; 0: never (the default)
  cacheTokens @11 :UInt32;  # KV positions kept for cached prompt prefixes on top of parallel x contextSize
                            # (0: none extra; cached prefixes then live in the room the slots do not use)
  chatTemplate @12 :Text;   # how chat messages become the prompt: empty, the file's own template (Jinja,
                            # rendered as transformers does), or the arch's format when it stores none;
                            # else a built-in format by name: chatml, llama3, llama2, zephyr, phi3, gemma
}

struct PlacementStage {
  worker @0 :UInt32;        # index into ModelInfo.workers
  backend @1 :Text;
  firstLayer @2 :UInt32;    # [firstLayer, endLayer)
  endLayer @3 :UInt32;
  embeddings @4 :Bool;      # this stage looks up token embeddings
  output @5 :Bool;          # this stage computes the output norm, projection and sampling
}

struct Placement {
  stages @0 :List(PlacementStage);  # in pipeline order
  summary @1 :Text;                 # e.g. "cpu:0 layers 0-29 + embeddings + output"
  assignments @2 :List(PlacementAssignment);
  # The placement plan: which worker runs which operators of the model's graph, in order (a later
  # assignment takes precedence for what it names). Today's plans are one assignment per stage.
  exchanges @3 :List(PlacementExchange);
  # The tensors that cross workers.
}

struct PlacementAssignment {
  worker @0 :UInt32;        # index into ModelInfo.workers
  backend @1 :Text;
  embeddings @2 :Bool;
  firstLayer @3 :UInt32;    # layers [firstLayer, endLayer); equal: none
  endLayer @4 :UInt32;
  output @5 :Bool;          # the output norm, projection and sampling
  operators @6 :List(Text); # only these operators of the layers ("attention", "matmul", ...); empty: all
  neuronBegin @7 :UInt64;   # only FFN neurons [neuronBegin, neuronEnd) of the layers; both 0: all
  neuronEnd @8 :UInt64;
  nodes @9 :UInt32;         # graph operators the worker runs
}

struct PlacementExchange {
  fromWorker @0 :UInt32;
  toWorker @1 :UInt32;
  tensor @2 :Text;          # e.g. "blk.14.ffn_res", the residual stream after layer 14
  floatsPerToken @3 :UInt32;
  via @4 :Text;             # e.g. "shared memory (hidden-state exchange)"
}

enum ModelState {
  loading @0;
  ready @1;
  recovering @2;            # a worker died and is being restarted
  failed @3;                # a worker crashed too often; unload and load again
}

struct WorkerInfo {
  index @0 :UInt32;
  backend @1 :Text;
  pid @2 :UInt32;
  state @3 :Text;           # "starting", "ready", "restarting", "failed"
  rssBytes @4 :UInt64;      # private resident memory (RssAnon)
  sharedBytes @5 :UInt64;   # resident shared memory (the weights segment pages it touched)
  uptimeMs @6 :UInt64;
  restarts @7 :UInt32;
  lastRestartMs @8 :Float64;  # time from the crash to the restarted worker being ready
  steps @9 :UInt64;         # forward passes run
  tokens @10 :UInt64;       # tokens processed (prompt and generated)
  device @11 :Text;         # e.g. "CPU (AVX-512 VNNI), 2 threads"
}

struct ModelInfo {
  id @0 :Text;
  path @1 :Text;
  name @2 :Text;            # general.name
  arch @3 :Text;
  description @4 :Text;     # size, types
  state @5 :ModelState;
  weightsBytes @6 :UInt64;  # size of the shared-memory weights segment
  contextSize @7 :UInt32;
  parallel @8 :UInt32;
  vocabSize @9 :UInt32;
  chatTemplate @10 :Text;   # the template family used for chat messages ("chatml", "llama3", ...)
  placement @11 :Placement;
  workers @12 :List(WorkerInfo);
  loadMs @13 :Float64;      # time the load took
  weightsHugePageBytes @14 :UInt64;  # of weightsBytes, backed by 2 MiB pages (0: 4 KiB pages only)
  keepAliveS @15 :Float64;  # unloaded after this many idle seconds; 0: never
  unloadInS @16 :Float64;   # seconds until that idle unload; -1: not scheduled (never, or busy)
  loadStage @17 :Text;      # while loading: "copying", "interleaving", "validating", "starting workers"
  loadDone @18 :UInt64;     # progress of that stage: loadDone of loadTotal (bytes, for the copy and the interleaving)
  loadTotal @19 :UInt64;
}

struct ModelStatus {
  info @0 :ModelInfo;
  kvBytes @1 :UInt64;
  slotsUsed @2 :UInt32;
  kvTokensUsed @3 :UInt64;  # sum of sequence lengths in use
  requestsActive @4 :UInt32;
  requestsQueued @5 :UInt32;
  requestsDone @6 :UInt64;
  requestsFailed @7 :UInt64;
  promptTokens @8 :UInt64;
  generatedTokens @9 :UInt64;
  decodeTokensPerSecond @10 :Float64;  # over the last few seconds of decoding
  replays @11 :UInt64;      # requests replayed on a restarted worker
  stepComputeUs @12 :Float64;   # mean time of a step inside the workers (forward pass + sampling)
  stepOverheadUs @13 :Float64;  # mean time a worker waits between steps (rings, wake-ups, scheduling):
                                # from when it could start a step (queued, or the one before done) to
                                # its completion, minus stepComputeUs
  # The prefix cache (KV blocks of 64 positions shared between requests with a common prompt start):
  cacheBlocks @14 :UInt32;       # the KV pool, in blocks
  cacheBlocksUsed @15 :UInt32;   # held by requests in flight
  cacheBlocksCached @16 :UInt32; # held by no request, kept for later requests (evictable)
  cacheHits @17 :UInt64;         # requests that found a cached prefix
  cacheHitTokens @18 :UInt64;    # prompt tokens taken from the cache instead of computed
  cacheEvictions @19 :UInt64;    # cached blocks evicted to make room
}

struct DaemonStatus {
  version @0 :Text;
  protocolVersion @1 :UInt32;
  pid @2 :UInt32;
  uptimeMs @3 :UInt64;
  socketPath @4 :Text;
  models @5 :List(ModelStatus);
  connections @6 :UInt32;
  requestsTotal @7 :UInt64;
  requestsRejected @8 :UInt64;  # OVERLOADED answers
  rssBytes @9 :UInt64;
}

interface LoadProgress {
  update @0 (stage :Text, done :UInt64, total :UInt64) -> stream;
  # stage: "copying", "interleaving", "validating", "starting workers"; done/total in bytes or workers.
}

interface Admin {
  load @0 (path :Text, options :LoadOptions, progress :LoadProgress) -> (model :ModelInfo);
  # `progress` may be null. The path is opened by the daemon, so it must be readable by the daemon's
  # user. Fails if the id is taken, the file is missing, not GGUF, corrupt, or of an unsupported arch.
  unload @1 (id :Text) -> ();
  # Requests in flight on the model end with FAILED "model unloaded".
  list @2 () -> (models :List(ModelInfo));
  status @3 () -> (status :DaemonStatus);
}

# ------------------------------------------------------------------------------------------------
# Inference

struct Sampling {
  # The same fields, defaults and ranges as llama.cpp's sampler; out-of-range values are refused.
  temperature @0 :Float32 = 0.8;       # [0, 100]; 0 = greedy
  topK @1 :Int32 = 40;                 # <= 0: disabled
  topP @2 :Float32 = 0.95;             # (0, 1]
  minP @3 :Float32 = 0.05;             # [0, 1)
  repeatPenalty @4 :Float32 = 1.0;     # (0, 100]
  repeatLastN @5 :Int32 = 64;          # -1: whole history
  frequencyPenalty @6 :Float32 = 0.0;  # [-2, 2]
  presencePenalty @7 :Float32 = 0.0;   # [-2, 2]
  seed @8 :UInt64 = 0xffffffffffffffff;  # this value: chosen by the daemon and reported in the result
}

struct ChatMessage {
  role @0 :Text;            # "system", "user", "assistant"
  content @1 :Text;
}

struct GenerateRequest {
  model @0 :Text;
  input :union {
    prompt @1 :Text;                   # raw text
    messages @2 :List(ChatMessage);    # formatted with the model's chat template
    tokens @3 :List(Int32);            # already tokenized
  }
  sampling @4 :Sampling;
  maxTokens @5 :UInt32 = 256;          # 0: until end of generation or the context is full
  stop @6 :List(Text);                 # generation ends before the first occurrence of any of these
  addSpecial @7 :Bool = true;          # prepend BOS if the model wants it (prompt/messages only)
  parseSpecial @8 :Bool = true;        # "<|im_start|>" etc. in the text become special tokens
  ignoreEog @9 :Bool = false;          # keep going past end-of-generation tokens
  streamIntervalMs @10 :Int32 = -1;    # after the first batch, at most one batch per this many ms (the
                                       # last is never held back): fewer wake-ups for the client and the
                                       # daemon, so more CPU for the model; 0: each batch as soon as it is
                                       # ready; -1: the daemon's stream-interval (20 unless configured)
  cachePrompt @11 :Bool = true;        # reuse the KV of the longest cached prefix of the prompt (and let
                                       # later requests reuse this one's)
}

struct TokenBatch {
  tokens @0 :List(Int32);   # the generated ids since the previous batch
  text @1 :Text;            # their text, complete UTF-8; text that might start a stop string is
                            # held back until it is decided
}

interface TokenSink {
  send @0 (batch :TokenBatch) -> stream;
  done @1 ();
  # Called once, after the last send() and before generate returns: streaming calls are acknowledged
  # by flow control, not on delivery, so this ordinary call is the barrier after which every batch has
  # been handled (a client whose handlers run as separate tasks, as pycapnp's do, needs it). Errors
  # from it are ignored: a sink that does not implement it only loses the guarantee.
}

enum FinishReason {
  endOfGeneration @0;       # the model produced an end-of-generation token
  maxTokens @1;
  stop @2;                  # a stop string matched
  contextFull @3;           # the sequence reached the context size
}

struct GenerateResult {
  finishReason @0 :FinishReason;
  promptTokens @1 :UInt32;
  generatedTokens @2 :UInt32;
  seed @3 :UInt64;          # the seed actually used (replays the run)
  queueMs @4 :Float64;      # waiting for a slot
  timeToFirstTokenMs @5 :Float64;  # from the request's arrival
  promptMs @6 :Float64;     # prefill time
  generateMs @7 :Float64;   # first to last generated token
  replays @8 :UInt32;       # times the request was replayed on a restarted worker
  cachedTokens @9 :UInt32;  # prompt tokens taken from the prefix cache (not computed)
}

interface Inference {
  list @0 () -> (models :List(ModelInfo));
  tokenize @1 (model :Text, text :Text, addSpecial :Bool, parseSpecial :Bool) -> (tokens :List(Int32));
  detokenize @2 (model :Text, tokens :List(Int32)) -> (text :Text);
  generate @3 (request :GenerateRequest, sink :TokenSink) -> (result :GenerateResult);
  # Returns when generation ends, after every batch was sent to `sink`.
}
