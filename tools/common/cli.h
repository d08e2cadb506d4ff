// tools/common/cli.h — the small command-line parser shared by inferd's tools.
//
// Options are declared with a pointer to their destination; parse() fills them and reports unknown
// options, missing values and malformed numbers as errors (never exceptions or aborts).
// Thread safety: single-threaded use at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "inferd/status.h"

namespace inferd::cli {

class Parser {
 public:
  Parser(std::string program, std::string summary);

  void flag(std::vector<std::string> names, bool* dst, std::string help);
  void option(std::vector<std::string> names, std::string* dst, std::string metavar, std::string help);
  void option(std::vector<std::string> names, int32_t* dst, std::string metavar, std::string help);
  void option(std::vector<std::string> names, int64_t* dst, std::string metavar, std::string help);
  void option(std::vector<std::string> names, uint64_t* dst, std::string metavar, std::string help);
  void option(std::vector<std::string> names, float* dst, std::string metavar, std::string help);

  // Parses argv. `--help` sets help_requested() and returns OK.
  Status parse(int argc, char** argv);
  bool help_requested() const { return help_; }
  std::string usage() const;

 private:
  enum class Kind { kFlag, kString, kI32, kI64, kU64, kF32 };
  struct Opt {
    std::vector<std::string> names;
    Kind kind;
    void* dst;
    std::string metavar, help, default_text;
  };
  void add(std::vector<std::string> names, Kind kind, void* dst, std::string metavar, std::string help);
  static Status store(const Opt& opt, const std::string& name, const std::string& value);

  std::string program_, summary_;
  std::vector<Opt> opts_;
  bool help_ = false;
};

// The model a tool uses when -m is not given: $INFERD_MODEL, else the default model of scripts/setup.sh.
std::string default_model_path();

// Runs parse() and handles --help and errors: returns -1 to continue, else the exit code to return.
int parse_or_exit(Parser& parser, int argc, char** argv);

}  // namespace inferd::cli
