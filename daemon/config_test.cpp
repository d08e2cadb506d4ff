#include "config.h"
#include "inferd/testing/scoped_env.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace inferd::daemon {
namespace {

using inferd::testing::ScopedEnv;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "inferd-config-XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` to dir_/name and returns the path.
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // parse_config over {"inferd", args...} with `default_file` as the default configuration file.
  static Result<DaemonConfig> parse(std::vector<std::string> args, const std::string& default_file = "") {
    args.insert(args.begin(), "inferd");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    return parse_config(static_cast<int>(argv.size()), argv.data(), default_file);
  }

  // A configuration file holding `line` (after one comment line), parsed; must fail.
  Status file_error(const std::string& line) {
    const std::string path = write("bad.conf", "# header\n" + line + "\n");
    Result<DaemonConfig> r = parse({"--config", path});
    EXPECT_FALSE(r.is_ok()) << line;
    return r.status();
  }

  std::string dir_;
  // The socket default depends on the environment: pin it.
  ScopedEnv socket_env_{"INFERD_SOCKET", "/run/test/inferd.sock"};
};

TEST_F(ConfigTest, DefaultsWithoutFileOrFlags) {
  Result<DaemonConfig> r = parse({});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const DaemonConfig& c = *r;
  EXPECT_EQ(c.socket_path, "/run/test/inferd.sock");
  EXPECT_TRUE(c.worker_path.ends_with("/inferd-worker")) << c.worker_path;
  EXPECT_EQ(c.worker_path.front(), '/');
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.threads, 0u);
  EXPECT_EQ(c.max_restarts, 5u);
  EXPECT_EQ(c.restart_window_s, 60.0);
  EXPECT_EQ(c.default_context, 0u);
  EXPECT_EQ(c.default_parallel, 4u);
  EXPECT_EQ(c.max_queue, 64u);
  EXPECT_EQ(c.steps_in_flight, 2u);
  EXPECT_EQ(c.matmul_order, "");
  EXPECT_EQ(c.stream_interval_ms, 20u);
  EXPECT_TRUE(c.admin_uids.empty());
  EXPECT_FALSE(c.admin_open());  // the daemon's own uid and root only
  EXPECT_TRUE(c.load.empty());
}

TEST_F(ConfigTest, DefaultSocketPathFollowsEnvironment) {
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000");
    EXPECT_EQ(default_socket_path(), "/run/test/inferd.sock");  // INFERD_SOCKET first
  }
  ScopedEnv no_socket("INFERD_SOCKET", std::nullopt);
  {
    ScopedEnv xdg("XDG_RUNTIME_DIR", "/run/user/1000");
    EXPECT_EQ(default_socket_path(), "/run/user/1000/inferd/inferd.sock");
  }
  {
    ScopedEnv empty("INFERD_SOCKET", "");  // empty counts as unset
    ScopedEnv xdg("XDG_RUNTIME_DIR", std::nullopt);
    const std::string expected = ::geteuid() == 0
                                     ? "/run/inferd/inferd.sock"
                                     : "/tmp/inferd-" + std::to_string(::geteuid()) + "/inferd.sock";
    EXPECT_EQ(default_socket_path(), expected);
    Result<DaemonConfig> r = parse({});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->socket_path, expected);
  }
}

TEST_F(ConfigTest, ReadsEveryKeyFromFile) {
  const std::string path = write("inferd.conf",
                                 "# inferd configuration\n"
                                 "\n"
                                 "socket = /run/x/inferd.sock\n"
                                 "  worker=/opt/inferd/inferd-worker  \n"
                                 "log-level = debug\r\n"  // CRLF line
                                 "threads = 12\n"
                                 "\t# an indented comment\n"
                                 "max-restarts = 3\n"
                                 "restart-window = 2.5\n"
                                 "context = 8192\n"
                                 "parallel = 8\n"
                                 "max-queue = 128\n"
                                 "steps-in-flight = 1\n"
                                 "stream-interval = 0\n"
                                 "matmul-order = repacked\n"
                                 "admin-uids = 0, 1000 ,1001\n"
                                 "load = /models/llama-3.gguf\n"
                                 "load = /models/qwen.gguf id=qwen ctx=4096 parallel=2 threads=6 backend=cuda\n"
                                 "load = \"/models/with space/m.gguf\" backend=opencl:1\n");
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const DaemonConfig& c = *r;
  EXPECT_EQ(c.socket_path, "/run/x/inferd.sock");
  EXPECT_EQ(c.worker_path, "/opt/inferd/inferd-worker");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.threads, 12u);
  EXPECT_EQ(c.max_restarts, 3u);
  EXPECT_EQ(c.restart_window_s, 2.5);
  EXPECT_EQ(c.default_context, 8192u);
  EXPECT_EQ(c.default_parallel, 8u);
  EXPECT_EQ(c.max_queue, 128u);
  EXPECT_EQ(c.steps_in_flight, 1u);
  EXPECT_EQ(c.matmul_order, "repacked");
  EXPECT_EQ(c.stream_interval_ms, 0u);
  EXPECT_EQ(c.admin_uids, (std::vector<uint32_t>{0, 1000, 1001}));
  EXPECT_FALSE(c.admin_open());
  ASSERT_EQ(c.load.size(), 3u);
  EXPECT_EQ(c.load[0].path, "/models/llama-3.gguf");
  EXPECT_EQ(c.load[0].id, "llama-3");
  EXPECT_EQ(c.load[0].context_size, 0u);
  EXPECT_EQ(c.load[0].parallel, 0u);
  EXPECT_EQ(c.load[0].threads, 0u);
  EXPECT_EQ(c.load[0].backend, "cpu");
  EXPECT_EQ(c.load[1].path, "/models/qwen.gguf");
  EXPECT_EQ(c.load[1].id, "qwen");
  EXPECT_EQ(c.load[1].context_size, 4096u);
  EXPECT_EQ(c.load[1].parallel, 2u);
  EXPECT_EQ(c.load[1].threads, 6u);
  EXPECT_EQ(c.load[1].backend, "cuda");
  EXPECT_EQ(c.load[2].path, "/models/with space/m.gguf");
  EXPECT_EQ(c.load[2].id, "m");
  EXPECT_EQ(c.load[2].backend, "opencl:1");
}

// The example installed to /etc/inferd/inferd.conf parses, and so do its commented-out load lines.
TEST_F(ConfigTest, ShippedExampleConfigParses) {
  const std::string example = std::string(INFERD_SOURCE_DIR) + "/systemd/inferd.conf";
  Result<DaemonConfig> r = parse({"--config", example});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->socket_path, "/run/inferd/inferd.sock");  // what inferd.socket listens on
  EXPECT_EQ(r->admin_uids, std::vector<uint32_t>{0});
  EXPECT_TRUE(r->load.empty());

  std::ifstream in(example);
  std::string text, line;
  while (std::getline(in, line)) {
    if (line.starts_with("# load = ")) line = line.substr(2);
    text += line + "\n";
  }
  r = parse({"--config", write("uncommented.conf", text)});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->load.size(), 2u);
  EXPECT_EQ(r->load[0].id, "llama");
  EXPECT_EQ(r->load[0].context_size, 8192u);
  EXPECT_EQ(r->load[1].path, "/home/alice/models/qwen 2.5 7b.gguf");
  EXPECT_EQ(r->load[1].backend, "cuda");
}

// Admin is for the daemon's own uid and root unless configured: a list adds uids, "any" opens it to every
// peer; max-text-bytes has its bounds.
TEST_F(ConfigTest, AdminUidsAnyAndMaxTextBytes) {
  Result<DaemonConfig> r = parse({"--admin-uids", "any", "--max-text-bytes", "2048"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(r->admin_open());
  EXPECT_EQ(r->max_text_bytes, 2048u);
  r = parse({"--admin-uids", "any", "--admin-uids", "1000"});  // the last one wins
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->admin_open());
  EXPECT_EQ(r->admin_uids, std::vector<uint32_t>{1000});
  EXPECT_FALSE(parse({"--max-text-bytes", "100"}).is_ok());
  EXPECT_FALSE(parse({"--max-text-bytes", "999999999"}).is_ok());
}

TEST_F(ConfigTest, HttpApiAndModelsByName) {
  Result<DaemonConfig> r = parse({"--socket", "/tmp/x/inferd.sock"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(default_http_socket(r->socket_path), "/tmp/x/inferd-http.sock");
  EXPECT_EQ(default_http_socket("/run/d/api"), "/run/d/api-http");
  EXPECT_EQ(r->keep_alive_s, 300.0);
  EXPECT_TRUE(r->model_dirs.empty());
  EXPECT_EQ(r->http_connections_per_peer, 64u);
  EXPECT_EQ(parse({"--http-connections-per-peer", "8"})->http_connections_per_peer, 8u);
  EXPECT_FALSE(parse({"--http-connections-per-peer", "0"}).is_ok());
  r = parse({"--http-listen", "127.0.0.1:11435", "--http-keys", "/etc/inferd/keys", "--http-socket", "off",
             "--model-dirs", "/srv/models:/opt/m", "--keep-alive", "0"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->http_listen, "127.0.0.1:11435");
  EXPECT_EQ(r->http_keys, "/etc/inferd/keys");
  EXPECT_EQ(r->http_socket, "off");
  EXPECT_EQ(r->model_dirs, (std::vector<std::string>{"/srv/models", "/opt/m"}));
  EXPECT_EQ(r->keep_alive_s, 0.0);
  EXPECT_FALSE(r->http_no_auth);
  for (const char* bad : {"11435", "host:", ":80", "h:0", "h:65536", "h:http"}) {
    EXPECT_FALSE(parse({"--http-listen", bad}).is_ok()) << bad;
  }
  EXPECT_FALSE(parse({"--http-no-auth", "yes"}).is_ok());
  EXPECT_FALSE(parse({"--keep-alive", "-1"}).is_ok());
  EXPECT_FALSE(parse({"--model-dirs", "/a::/b"}).is_ok());
}

TEST_F(ConfigTest, FlagsOverrideFile) {
  const std::string path = write("inferd.conf",
                                 "threads = 12\n"
                                 "log-level = debug\n"
                                 "admin-uids = 1000\n"
                                 "load = /models/a.gguf\n"
                                 "load = /models/b.gguf\n");
  Result<DaemonConfig> r = parse({"--config=" + path, "--threads", "4", "--threads=6", "--log-level=warn",
                                  "--admin-uids", "0,7", "--load", "/m/c.gguf", "--load=/m/d.gguf id=dd",
                                  "--restart-window", "30"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->threads, 6u);  // the last flag wins
  EXPECT_EQ(r->log_level, "warn");
  EXPECT_EQ(r->admin_uids, (std::vector<uint32_t>{0, 7}));
  EXPECT_EQ(r->restart_window_s, 30.0);
  ASSERT_EQ(r->load.size(), 2u);  // --load replaced the file's list
  EXPECT_EQ(r->load[0].path, "/m/c.gguf");
  EXPECT_EQ(r->load[1].id, "dd");
}

TEST_F(ConfigTest, FileLoadsKeptWithoutLoadFlags) {
  const std::string path = write("inferd.conf", "load = /models/a.gguf\n");
  Result<DaemonConfig> r = parse({"--config", path, "--parallel", "2"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->load.size(), 1u);
  EXPECT_EQ(r->default_parallel, 2u);
}

TEST_F(ConfigTest, RelativePathsResolveAgainstFileDirectoryOrWorkingDirectory) {
  const std::string path = write("inferd.conf",
                                 "socket = run/inferd.sock\n"
                                 "worker = ../bin/inferd-worker\n"
                                 "load = models/a.gguf\n");
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const std::string dir = std::filesystem::path(dir_).lexically_normal().string();
  EXPECT_EQ(r->socket_path, dir + "/run/inferd.sock");
  EXPECT_EQ(r->worker_path, std::filesystem::path(dir).parent_path().string() + "/bin/inferd-worker");
  EXPECT_EQ(r->load[0].path, dir + "/models/a.gguf");

  const std::string cwd = std::filesystem::current_path().string();
  r = parse({"--socket", "s.sock", "--load", "./m/b.gguf"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->socket_path, cwd + "/s.sock");
  EXPECT_EQ(r->load[0].path, cwd + "/m/b.gguf");
}

TEST_F(ConfigTest, DefaultFileIsReadOnlyWhenItExists) {
  const std::string path = write("default.conf", "threads = 3\n");
  Result<DaemonConfig> r = parse({}, path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->threads, 3u);

  r = parse({}, dir_ + "/missing.conf");  // a missing default file is not an error
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->threads, 0u);

  const std::string other = write("other.conf", "threads = 9\n");
  r = parse({"--config", other}, path);  // --config replaces the default file
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->threads, 9u);

  r = parse({}, dir_);  // a directory where the default file should be
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
}

// Opening a FIFO for reading would block until a writer came; the daemon must refuse it instead.
TEST_F(ConfigTest, FifoAsConfigIsRefusedWithoutBlocking) {
  const std::string path = dir_ + "/fifo.conf";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), "--config: " + path + ": not a regular file");
}

TEST_F(ConfigTest, MissingConfigFileIsNotFound) {
  Result<DaemonConfig> r = parse({"--config", dir_ + "/nope.conf"});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("--config: " + dir_ + "/nope.conf"), std::string::npos)
      << r.status().message();
}

TEST_F(ConfigTest, HelpWinsAndCarriesUsage) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"-h"}, {"--threads", "x", "--help"}, {"--bogus", "-h"}}) {
    Result<DaemonConfig> r = parse(args);
    ASSERT_FALSE(r.is_ok());
    EXPECT_TRUE(is_help_request(r.status())) << r.status().to_string();
    EXPECT_EQ(r.status().message(), usage());
  }
  // No other outcome is mistaken for help.
  EXPECT_FALSE(is_help_request(parse({"--bogus"}).status()));
  EXPECT_FALSE(is_help_request(Status::ok()));
}

TEST_F(ConfigTest, UsageNamesEveryKey) {
  const std::string text = usage();
  for (const char* key : {"--config", "--help", "--socket", "--worker", "--log-level", "--threads",
                          "--max-restarts", "--restart-window", "--context", "--parallel", "--max-queue",
                          "--steps-in-flight", "--stream-interval", "--matmul-order",
                          "--admin-uids", "--load"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key;
  }
}

// Every bad line fails with kInvalidArgument, names the file and line 2 and says what is wrong.
TEST_F(ConfigTest, FileErrorsNameFileLineAndProblem) {
  struct Case {
    std::string line;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"threads 4", "expected 'key = value', got 'threads 4'"},
      {"= 4", "no key before '='"},
      {"thread = 4", "unknown key 'thread'"},
      {"--threads = 4", "write keys without the leading '--'"},
      {"config = /x", "config is only a command-line flag"},
      {"threads =", "missing value for 'threads'"},
      {"threads = four", "threads: 'four' is not a whole number"},
      {"threads = -1", "threads: '-1' is not a whole number"},
      {"threads = 4 # physical cores", "comments must be on their own line"},
      {"threads = 4294967296", "threads: '4294967296' is out of range (0..4294967295)"},
      {"threads = 99999999999999999999999", "is out of range"},
      {"parallel = 0", "parallel: '0' is out of range (1..4294967295)"},
      {"max-queue = 0", "max-queue: '0' is out of range (1..4294967295)"},
      {"steps-in-flight = 0", "steps-in-flight: '0' is out of range (1..4)"},
      {"steps-in-flight = 5", "steps-in-flight: '5' is out of range (1..4)"},
      {"stream-interval = 60001", "stream-interval: '60001' is out of range (0..60000)"},
      {"matmul-order = fast", "matmul-order: unknown matmul order 'fast' (expected vec_dot or repacked)"},
      {"restart-window = 0", "restart-window: '0' must be more than 0 seconds"},
      {"restart-window = -5", "restart-window: '-5' must be more than 0 seconds"},
      {"restart-window = inf", "restart-window: 'inf' is not a number of seconds"},
      {"restart-window = 1m", "restart-window: '1m' is not a number of seconds"},
      {"log-level = verbose", "log-level: unknown level 'verbose' (expected trace, debug"},
      {"admin-uids = 0,,1", "admin-uids: empty entry in the uid list '0,,1'"},
      {"admin-uids = 1000,root", "admin-uids: bad uid: 'root' is not a whole number"},
      {"admin-uids = 4294967295", "admin-uids: bad uid: '4294967295' is out of range (0..4294967294)"},
      {"socket = /" + std::string(120, 's'), "bytes long; a unix socket path holds at most 107"},
      {"load = /m/a.gguf ctx=big", "load: ctx=: 'big' is not a whole number"},
      {"load = /m/a.gguf flash=1", "load: unknown load option 'flash'"},
      {"load = /m/a.gguf id=x id=y", "load option 'id' given twice"},
      {"load = /m/a.gguf id=", "load option 'id' has no value"},
      {"load = /m/a.gguf backend=vulkan", "unknown backend 'vulkan' (expected cpu, cuda, cuda:N, opencl or opencl:N)"},
      {"load = /m/a.gguf backend=opencl:x", "unknown backend 'opencl:x'"},
      {"load = /m/a.gguf backend=cpu:1", "unknown backend 'cpu:1'"},
      {"load = /home/me/my model.gguf", "unexpected 'model.gguf' after the model path"},
      {"load = \"/m/a.gguf", "unterminated quote"},
      {"load = \"/m/a.gguf\"id=x", "expected a space after the quoted path"},
      {"load = \"\" id=x", "the model path is empty"},
      {"load = /", "cannot derive a model id from '/'"},
      {"threads = \x01", "'\\x01' is not a whole number"},
  };
  for (const Case& c : cases) {
    const Status status = file_error(c.line);
    EXPECT_EQ(status.code(), Code::kInvalidArgument) << c.line;
    const std::string& msg = status.message();
    EXPECT_TRUE(msg.starts_with(dir_ + "/bad.conf:2: ")) << c.line << " -> " << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.line << " -> " << msg;
  }
}

TEST_F(ConfigTest, DuplicateKeyNamesFirstLine) {
  const std::string path = write("dup.conf", "threads = 4\n# x\nthreads = 8\n");
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), path + ":3: 'threads' is already set at line 1");
}

TEST_F(ConfigTest, DuplicateModelIdIsRejected) {
  const std::string path = write("dup.conf", "load = /a/m.gguf\nload = /b/m.gguf\n");
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(":2: load: model id 'm' is already used by '/a/m.gguf'"),
            std::string::npos)
      << r.status().message();
  // Distinct ids make the same file loadable twice.
  r = parse({"--load", "/a/m.gguf", "--load", "/a/m.gguf id=m2"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->load[1].id, "m2");
}

TEST_F(ConfigTest, FlagErrorsNameFlagAndProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--bogus", "1"}, "--bogus: unknown flag"},
      {{"--threads"}, "--threads: missing value"},
      {{"--threads="}, "--threads: missing value"},
      {{"--socket", "--threads", "4"}, "--socket: missing value"},
      {{"--config"}, "--config: missing value"},
      {{"threads", "4"}, "unexpected argument 'threads'"},
      {{"-t", "4"}, "unexpected argument '-t'"},
      {{"--"}, "unexpected argument '--'"},
      {{"--threads", "4x"}, "--threads: '4x' is not a whole number"},
      {{"--parallel=0"}, "--parallel: '0' is out of range (1..4294967295)"},
      {{"--log-level", "loud"}, "--log-level: unknown level 'loud'"},
      {{"--admin-uids", "1,"}, "--admin-uids: empty entry in the uid list '1,'"},
      {{"--load", "/m/a.gguf backend=tpu"}, "--load: unknown backend 'tpu'"},
      {{"--load", "/m/a.gguf", "--load", "/b/a.gguf"}, "--load: model id 'a' is already used"},
  };
  for (const Case& c : cases) {
    Result<DaemonConfig> r = parse(c.args);
    ASSERT_FALSE(r.is_ok()) << c.expected;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << c.expected;
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << "expected '" << c.expected << "' in '" << r.status().message() << "'";
  }
}

TEST_F(ConfigTest, BinaryGarbageIsAnErrorNotACrash) {
  std::string junk;
  uint32_t x = 12345;  // fixed-seed LCG
  for (int i = 0; i < 4096; ++i) {
    x = x * 1664525u + 1013904223u;
    junk += static_cast<char>(x >> 24);
  }
  const std::string path = write("junk.conf", junk);
  Result<DaemonConfig> r = parse({"--config", path});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(r.status().message().starts_with(path + ":")) << r.status().message();
}

}  // namespace
}  // namespace inferd::daemon
