// daemon/jinja.h — the subset of Jinja2 that chat templates use, to render the template a GGUF file
// stores (tokenizer.chat_template) as Hugging Face's transformers renders it.
//
// transformers renders chat templates with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) plus the loop-controls extension, a `tojson` filter of its own (json.dumps with
// ensure_ascii=False) and the globals raise_exception() and strftime_now(). This engine implements that
// environment: text, {{ expressions }}, {% if / elif / else %}, {% for %} (tuple targets, `if` filters,
// `else`, loop.index/first/last/..., break/continue), {% set %} (names, namespace attributes, blocks),
// {% macro %} and calls, {# comments #}, whitespace control (-, +, trim_blocks, lstrip_blocks); Python
// values (None, bools, ints, floats, strings, lists, dicts in insertion order) with Python's semantics
// for operators, truthiness, comparisons and str(); the filters, tests and string/dict/list methods
// that real templates call (jinja.cpp lists them). Anything else — an unknown tag, filter, test or
// method — is an error that names the construct and its line, at parse time where it can be known.
// Tests compare it with jinja2 itself on the templates of every supported model family
// (tests/data/chat_templates/).
//
// Thread safety: a Template is immutable once parsed; render() may run on several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/status.h"

namespace inferd::jinja {

class Value;
using Array = std::vector<Value>;
// A dict: keys in insertion order, as Python's.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): the only object {% set ns.x = ... %} may change

  const Value* find(std::string_view key) const;
  void set(std::string key, Value v);
};
struct Call;
using Function = std::function<Result<Value>(Call&)>;

// A Jinja value. Arrays and objects are shared (Python's reference semantics: list.append changes the list
// every name of it sees).
class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);  // NOLINT: implicit, as Python literals
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v);
  Value(double v);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(Array a);
  Value(Object o);
  static Value function(Function f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool boolean() const { return b_; }
  int64_t integer() const { return i_; }
  double number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& str() const { return *s_; }
  Array& array() const { return *a_; }
  Object& object() const { return *o_; }
  const Function& fn() const { return *fn_; }

  bool truthy() const;
  // Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", lists and dicts as repr; undefined -> "".
  std::string to_string() const;
  // Python's repr() (strings quoted).
  std::string repr() const;
  // json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys=sort_keys).
  Result<std::string> to_json(int indent = -1, bool sort_keys = false) const;
  bool operator==(const Value& o) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
  std::shared_ptr<const Function> fn_;
};

// The arguments of a call to a built-in function or method.
struct Call {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument named `name`, else the positional one at `index`, else undefined.
  const Value& arg(size_t index, std::string_view name = {}) const;
};

// Builds a Value from JSON text (objects keep their key order). For tests and the daemon's messages.
Result<Value> from_json(std::string_view json);

struct Node;

// Bounds on one rendering (a template from a file must not hang or exhaust the daemon).
struct RenderLimits {
  int64_t max_steps = 5'000'000;  // nodes rendered plus expressions evaluated
};

class Template {
 public:
  // Parses `source`; an error names the construct and its line.
  static Result<Template> parse(std::string_view source);

  // Renders with `context` (an object of global names). `now` is strftime_now()'s time (seconds since
  // the epoch, local time zone).
  Result<std::string> render(const Value& context, int64_t now = 0, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace inferd::jinja
