# The control channel between the supervisor (inferd) and one worker process (inferd-worker).
#
# Carried over a unix socketpair the supervisor creates at spawn, as frames of
# [u32 little-endian byte length][Cap'n Proto flat message] (ipc/frame.h). It is not the hot path:
# tokens, positions and sampled ids travel through the shared-memory rings (ipc/ring.h); this channel
# carries the handshake, configuration, health and shutdown.
#
# Sequence:
#   worker -> Hello          (protocol version, pid, backend)
#   supervisor -> Configure  (or closes the socket if the version is not served)
#   worker -> Ready | Failed (after attaching the weights segment and the rings)
#   supervisor -> Ping ... worker -> Pong   (any time)
#   supervisor -> Shutdown, or closes the socket: the worker exits.

@0xe16cbd1f773f2701;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("inferd::wire");

const workerProtocolVersion :UInt32 = 1;

struct Hello {
  protocolVersion @0 :UInt32;
  pid @1 :UInt32;
  backend @2 :Text;
}

struct Configure {
  protocolVersion @0 :UInt32;
  contextSize @1 :UInt32;   # tokens per slot
  slots @2 :UInt32;
  threads @3 :UInt32;       # 0: all CPUs the worker may run on
  batchTokens @4 :UInt32;   # most tokens in one submission
  padStep @5 :UInt32;
  firstLayer @6 :UInt32;    # the placement stage this worker runs
  endLayer @7 :UInt32;
  modelId @8 :Text;         # for log lines
  kvBlocks @9 :UInt32;      # the KV pool in blocks of 64 positions (0: slots x the blocks of one context)
}

struct Ready {
  device @0 :Text;          # "CPU (AVX-512 VNNI), 2 threads"
  kvBytes @1 :UInt64;
  arenaBytes @2 :UInt64;
  startMs @3 :Float64;      # from exec to ready, as the worker measured it
}

struct Pong {
  steps @0 :UInt64;
  tokens @1 :UInt64;
}

struct ToWorker {
  union {
    configure @0 :Configure;
    ping @1 :Void;
    shutdown @2 :Void;
  }
}

struct FromWorker {
  union {
    hello @0 :Hello;
    ready @1 :Ready;
    failed @2 :Text;        # could not start; the message says why (the supervisor logs it)
    pong @3 :Pong;
  }
}
