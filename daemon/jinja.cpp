#include "jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

namespace inferd::jinja {

// ---- Values ------------------------------------------------------------------------------------

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Object::set(std::string key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(Array a) : kind_(Kind::kArray), a_(std::make_shared<Array>(std::move(a))) {}
Value::Value(Object o) : kind_(Kind::kObject), o_(std::make_shared<Object>(std::move(o))) {}
Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_->empty();
    case Kind::kArray: return !a_->empty();
    case Kind::kObject: return !o_->items.empty();
    case Kind::kFunction: return true;
  }
  return false;
}

namespace {

// Python's repr() of a float: the shortest digits that read back, ".0" on integral values, exponent
// form below 1e-4 and from 1e16.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::general);
  (void)ec;
  std::string s(buf, end);
  // to_chars' general format picks the shorter of fixed and scientific; Python switches at exponents
  // -5 and 16.
  const double a = std::fabs(d);
  if (a != 0.0 && (a < 1e-4 || a >= 1e16)) {
    auto [e2, ec2] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
    (void)ec2;
    s.assign(buf, e2);
    // Python writes e-05 and e+16: at least two exponent digits.
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    const char sign = exp[0] == '-' ? '-' : '+';
    if (exp[0] == '-' || exp[0] == '+') exp = exp.substr(1);
    while (exp.size() < 2) exp = "0" + exp;
    return mant + "e" + sign + exp;
  }
  if (s.find_first_of(".en") == std::string::npos) {
    auto [e3, ec3] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::fixed);
    (void)ec3;
    s.assign(buf, e3);
    if (s.find('.') == std::string::npos) s += ".0";
  }
  return s;
}

std::string string_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status json_value(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  if (depth > 64) return Status(Code::kInvalidArgument, "tojson: the value is nested too deeply");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: out += "null"; return Status::ok();
    case Value::Kind::kBool: out += v.boolean() ? "true" : "false"; return Status::ok();
    case Value::Kind::kInt: out += std::to_string(v.integer()); return Status::ok();
    case Value::Kind::kFloat: {
      const double d = v.number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return Status::ok();
    }
    case Value::Kind::kString: json_string(v.str(), out); return Status::ok();
    case Value::Kind::kArray: {
      if (v.array().empty()) {
        out += "[]";
        return Status::ok();
      }
      out += '[';
      for (size_t i = 0; i < v.array().size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        INFERD_RETURN_IF_ERROR(json_value(v.array()[i], indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::ok();
    }
    case Value::Kind::kObject: {
      if (v.object().items.empty()) {
        out += "{}";
        return Status::ok();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.object().items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        json_string(items[i]->first, out);
        out += ": ";
        INFERD_RETURN_IF_ERROR(json_value(items[i]->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::ok();
    }
    case Value::Kind::kFunction: return Status(Code::kInvalidArgument, "tojson: a function is not JSON serializable");
  }
  return Status::ok();
}

}  // namespace

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return float_repr(f_);
    case Kind::kString: return string_repr(*s_);
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < a_->size(); ++i) out += (i ? ", " : "") + (*a_)[i].repr();
      return out + "]";
    }
    case Kind::kObject: {
      if (o_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < o_->items.size(); ++i) {
        out += (i ? ", " : "") + string_repr(o_->items[i].first) + ": " + o_->items[i].second.repr();
      }
      return out + "}";
    }
    case Kind::kFunction: return "<function>";
  }
  return "";
}

std::string Value::to_string() const { return kind_ == Kind::kString ? *s_ : repr(); }

Result<std::string> Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  INFERD_RETURN_IF_ERROR(json_value(*this, indent, sort_keys, 0, out));
  return out;
}

bool Value::operator==(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kInt && o.kind_ == Kind::kInt) return i_ == o.i_;
    return number() == o.number();
  }
  if (kind_ == Kind::kBool && o.is_number()) return Value(static_cast<int64_t>(b_)) == o;
  if (is_number() && o.kind_ == Kind::kBool) return *this == Value(static_cast<int64_t>(o.b_));
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kBool: return b_ == o.b_;
    case Kind::kString: return *s_ == *o.s_;
    case Kind::kArray: return *a_ == *o.a_;
    case Kind::kObject: {
      if (o_ == o.o_) return true;
      if (o_->items.size() != o.o_->items.size()) return false;
      for (const auto& [k, v] : o_->items) {
        const Value* w = o.o_->find(k);
        if (w == nullptr || !(v == *w)) return false;
      }
      return true;
    }
    case Kind::kFunction: return fn_ == o.fn_;
    default: return false;
  }
}

const Value& Call::arg(size_t index, std::string_view name) const {
  static const Value kUndefined;
  if (!name.empty()) {
    for (const auto& [k, v] : kwargs) {
      if (k == name) return v;
    }
  }
  return index < args.size() ? args[index] : kUndefined;
}

namespace {
Value from_nlohmann(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_nlohmann(e));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, e] : j.items()) o.set(k, from_nlohmann(e));
      return Value(std::move(o));
    }
    default: return Value();
  }
}
}  // namespace

Result<Value> from_json(std::string_view text) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status(Code::kInvalidArgument, "invalid JSON");
  return from_nlohmann(j);
}

// ---- Syntax tree ---------------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNeg, kPos, kNot, kBinary, kAnd, kOr, kCond,
    kList, kDict, kTuple,
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;                  // kLiteral
  std::string name;             // kName, kAttr, kFilter, kTest; kBinary: the operator
  ExprPtr a, b, c;              // operands; kSlice: object, start/stop in items[0..1], step in c
  std::vector<ExprPtr> items;   // kList, kTuple, kDict (key, value pairs), kCall/kFilter/kTest args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;         // kTest: "is not"
};

struct Node {
  enum class Kind : uint8_t { kBody, kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Kind kind = Kind::kBody;
  int line = 0;
  std::string text;                     // kText
  ExprPtr expr;                         // kOutput, kFor (iterable), kSet (value)
  std::vector<std::shared_ptr<Node>> body;  // kBody
  // kIf: conditions[i] guards branches[i]; else_branch may be null.
  std::vector<ExprPtr> conditions;
  std::vector<std::shared_ptr<Node>> branches;
  std::shared_ptr<Node> else_branch;
  // kFor: targets (one name, or a tuple); filter; body in branches[0].
  std::vector<std::string> targets;
  ExprPtr filter;
  // kSet / kSetBlock: target name, or namespace.attribute in (name, attr).
  std::string name, attr;
  // kMacro: parameters and defaults.
  std::vector<std::pair<std::string, ExprPtr>> params;
};
using NodePtr = std::shared_ptr<Node>;

namespace {

Status syntax_error(int line, const std::string& what) {
  return Status(Code::kInvalidArgument, "chat template, line " + std::to_string(line) + ": " + what);
}

// ---- Lexer ---------------------------------------------------------------------------------------

struct Tok {
  enum class Kind : uint8_t { kName, kString, kInt, kFloat, kOp, kEnd } kind = Kind::kEnd;
  std::string text;
  int64_t i = 0;
  double f = 0.0;
  int line = 0;
};

Result<std::vector<Tok>> lex_expression(std::string_view s, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') ++line;
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    Tok t;
    t.line = line;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      t.kind = Tok::Kind::kName;
      t.text = std::string(s.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k) {
        if (s[k] != '_') digits += s[k];
      }
      if (is_float) {
        t.kind = Tok::Kind::kFloat;
        t.f = std::strtod(digits.c_str(), nullptr);
      } else {
        t.kind = Tok::Kind::kInt;
        auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), t.i);
        if (ec != std::errc()) return syntax_error(line, "integer literal out of range");
        (void)p;
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      bool closed = false;
      while (j < s.size()) {
        const char d = s[j];
        if (d == c) {
          closed = true;
          ++j;
          break;
        }
        if (d == '\n') ++line;
        if (d == '\\' && j + 1 < s.size()) {
          const char e = s[j + 1];
          j += 2;
          switch (e) {
            case 'n': v += '\n'; break;
            case 't': v += '\t'; break;
            case 'r': v += '\r'; break;
            case '\\': v += '\\'; break;
            case '\'': v += '\''; break;
            case '"': v += '"'; break;
            case '0': v += '\0'; break;
            case 'u':
            case 'x': {
              const size_t n = e == 'u' ? 4 : 2;
              if (j + n > s.size()) return syntax_error(line, "truncated escape in a string literal");
              uint32_t cp = 0;
              for (size_t k = 0; k < n; ++k) {
                const char h = s[j + k];
                cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                                      : (std::tolower(static_cast<unsigned char>(h)) - 'a' + 10));
                if (!std::isxdigit(static_cast<unsigned char>(h))) return syntax_error(line, "bad escape in a string literal");
              }
              j += n;
              // UTF-8 of cp (surrogates kept as they come: templates do not use them).
              if (cp < 0x80) {
                v += static_cast<char>(cp);
              } else if (cp < 0x800) {
                v += static_cast<char>(0xC0 | (cp >> 6));
                v += static_cast<char>(0x80 | (cp & 0x3F));
              } else {
                v += static_cast<char>(0xE0 | (cp >> 12));
                v += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                v += static_cast<char>(0x80 | (cp & 0x3F));
              }
              break;
            }
            default:
              v += '\\';
              v += e;
          }
          continue;
        }
        v += d;
        ++j;
      }
      if (!closed) return syntax_error(t.line, "unterminated string literal");
      t.kind = Tok::Kind::kString;
      t.text = std::move(v);
      i = j;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "(", ")",
                                   "[", "]", "{", "}", ",", ".", ":", "|", "="};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.substr(i, n) == op) {
          t.kind = Tok::Kind::kOp;
          t.text = op;
          i += n;
          found = true;
          break;
        }
      }
      if (!found) return syntax_error(line, std::string("unexpected character '") + c + "'");
    }
    out.push_back(std::move(t));
  }
  Tok end;
  end.line = line;
  out.push_back(end);
  return out;
}

// ---- Template segments ----------------------------------------------------------------------------

struct Segment {
  enum class Kind : uint8_t { kText, kOutput, kStatement, kComment } kind = Kind::kText;
  std::string text;
  int line = 0;
  bool strip_before = false;  // {{- {%- {#-
  bool strip_after = false;   // -}} -%} -#}
  bool keep_lstrip = false;   // {%+ {#+
};

Result<std::vector<Segment>> segment(std::string_view src) {
  std::vector<Segment> out;
  size_t i = 0;
  int line = 1;
  auto count_lines = [](std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  while (i < src.size()) {
    size_t open = std::string_view::npos;
    for (size_t j = src.find('{', i); j != std::string_view::npos && j + 1 < src.size(); j = src.find('{', j + 1)) {
      if (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#') {
        open = j;
        break;
      }
    }
    if (open == std::string_view::npos) {
      out.push_back({Segment::Kind::kText, std::string(src.substr(i)), line});
      break;
    }
    if (open > i) {
      out.push_back({Segment::Kind::kText, std::string(src.substr(i, open - i)), line});
      line += count_lines(src.substr(i, open - i));
    }
    const char kind = src[open + 1];
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t body = open + 2;
    Segment seg;
    seg.line = line;
    seg.kind = kind == '{' ? Segment::Kind::kOutput : kind == '%' ? Segment::Kind::kStatement : Segment::Kind::kComment;
    if (body < src.size() && src[body] == '-') {
      seg.strip_before = true;
      ++body;
    } else if (body < src.size() && src[body] == '+') {
      seg.keep_lstrip = true;
      ++body;
    }
    size_t end = body;
    if (seg.kind == Segment::Kind::kOutput) {
      // "}}" may occur inside a string literal of the expression.
      char quote = 0;
      for (end = body; end + 1 < src.size(); ++end) {
        const char c = src[end];
        if (quote) {
          if (c == '\\') ++end;
          else if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == '}' && src[end + 1] == '}') {
          break;
        }
      }
      if (end + 1 >= src.size()) return syntax_error(line, "'{{' is never closed");
    } else {
      end = src.find(close, body);
      if (end == std::string_view::npos) {
        return syntax_error(line, std::string("'{") + kind + "' is never closed");
      }
    }
    std::string_view inner = src.substr(body, end - body);
    if (!inner.empty() && inner.back() == '-') {
      seg.strip_after = true;
      inner.remove_suffix(1);
    } else if (!inner.empty() && inner.back() == '+' && seg.kind != Segment::Kind::kOutput) {
      inner.remove_suffix(1);
    }
    seg.text = std::string(inner);
    line += count_lines(src.substr(open, end + 2 - open));
    out.push_back(std::move(seg));
    i = end + 2;
  }
  // Whitespace control: "-" strips all whitespace on its side; trim_blocks removes the newline after a
  // block or comment tag; lstrip_blocks removes the spaces and tabs before one on its line.
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k].kind != Segment::Kind::kText) continue;
    std::string& t = out[k].text;
    const Segment* prev = k > 0 ? &out[k - 1] : nullptr;
    const Segment* next = k + 1 < out.size() ? &out[k + 1] : nullptr;
    if (next && next->strip_before) {
      t.erase(t.find_last_not_of(" \t\n\r\v\f") + 1);
    } else if (next && next->kind != Segment::Kind::kOutput && !next->keep_lstrip) {
      const size_t nl = t.find_last_of('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool line_start = nl != std::string::npos || k == 0;
      if (line_start && t.find_first_not_of(" \t", from) == std::string::npos) t.erase(from);
    }
    if (prev && prev->strip_after) {
      t.erase(0, t.find_first_not_of(" \t\n\r\v\f") == std::string::npos ? t.size() : t.find_first_not_of(" \t\n\r\v\f"));
    } else if (prev && prev->kind != Segment::Kind::kOutput) {
      if (t.rfind("\r\n", 0) == 0) t.erase(0, 2);
      else if (!t.empty() && t[0] == '\n') t.erase(0, 1);
    }
  }
  return out;
}

// ---- Parser ----------------------------------------------------------------------------------------

class ExprParser {
 public:
  explicit ExprParser(std::vector<Tok> toks) : t_(std::move(toks)) {}

  const Tok& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Tok::Kind::kEnd; }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Kind::kOp && peek(ahead).text == op;
  }
  bool is_name(std::string_view n, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::Kind::kName && peek(ahead).text == n;
  }
  Tok next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  Status expect_op(std::string_view op) {
    if (!is_op(op)) return syntax_error(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
    ++p_;
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (peek().kind != Tok::Kind::kName) return syntax_error(peek().line, "expected a name, found " + describe(peek()));
    return next().text;
  }
  static std::string describe(const Tok& t) {
    switch (t.kind) {
      case Tok::Kind::kEnd: return "the end of the tag";
      case Tok::Kind::kString: return "a string";
      case Tok::Kind::kInt:
      case Tok::Kind::kFloat: return "a number";
      default: return "'" + t.text + "'";
    }
  }

  Result<ExprPtr> expression() { return conditional(); }
  // Without a trailing "x if c else y": a for loop's iterable, before its "if" filter.
  Result<ExprPtr> expression_no_cond() { return or_expr(); }

  // A tuple without parentheses ("a, b" in for targets and set), else one expression.
  Result<ExprPtr> tuple_or_expression() {
    auto first = expression();
    if (!first || !is_op(",")) return first;
    auto t = make(Expr::Kind::kTuple);
    t->items.push_back(*first);
    while (is_op(",")) {
      next();
      if (at_end() || is_op("]") || is_op(")")) break;
      auto e = expression();
      if (!e) return e;
      t->items.push_back(*e);
    }
    return ExprPtr(t);
  }

 private:
  std::shared_ptr<Expr> make(Expr::Kind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = peek().line;
    return e;
  }

  Result<ExprPtr> conditional() {
    auto then = or_expr();
    if (!then) return then;
    if (!is_name("if")) return then;
    next();
    auto cond = or_expr();
    if (!cond) return cond;
    auto e = make(Expr::Kind::kCond);
    e->a = *then;
    e->b = *cond;
    if (is_name("else")) {
      next();
      auto other = conditional();
      if (!other) return other;
      e->c = *other;
    }
    return ExprPtr(e);
  }
  Result<ExprPtr> or_expr() { return logical(Expr::Kind::kOr, "or", &ExprParser::and_expr); }
  Result<ExprPtr> and_expr() { return logical(Expr::Kind::kAnd, "and", &ExprParser::not_expr); }
  // sub (keyword sub)*, left-associative.
  Result<ExprPtr> logical(Expr::Kind kind, std::string_view keyword, Result<ExprPtr> (ExprParser::*sub)()) {
    auto l = (this->*sub)();
    while (l && is_name(keyword)) {
      next();
      auto r = (this->*sub)();
      if (!r) return r;
      auto e = make(kind);
      e->a = *l;
      e->b = *r;
      l = ExprPtr(e);
    }
    return l;
  }
  Result<ExprPtr> not_expr() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::kNot);
      next();
      auto x = not_expr();
      if (!x) return x;
      e->a = *x;
      return ExprPtr(e);
    }
    return compare();
  }
  Result<ExprPtr> compare() {
    auto l = math1();
    if (!l) return l;
    while (true) {
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      auto r = math1();
      if (!r) return r;
      auto e = make(Expr::Kind::kBinary);
      e->name = op;
      e->a = *l;
      e->b = *r;
      l = ExprPtr(e);
    }
    return l;
  }
  Result<ExprPtr> binary_chain(std::initializer_list<std::string_view> ops, Result<ExprPtr> (ExprParser::*sub)()) {
    auto l = (this->*sub)();
    while (l) {
      std::string op;
      for (std::string_view o : ops) {
        if (is_op(o)) op = std::string(o);
      }
      if (op.empty()) break;
      next();
      auto r = (this->*sub)();
      if (!r) return r;
      auto e = make(Expr::Kind::kBinary);
      e->name = op;
      e->a = *l;
      e->b = *r;
      l = ExprPtr(e);
    }
    return l;
  }
  Result<ExprPtr> math1() { return binary_chain({"+", "-"}, &ExprParser::concat); }
  Result<ExprPtr> concat() { return binary_chain({"~"}, &ExprParser::math2); }
  Result<ExprPtr> math2() { return binary_chain({"*", "/", "//", "%"}, &ExprParser::power); }
  Result<ExprPtr> power() { return binary_chain({"**"}, &ExprParser::unary_filtered); }
  Result<ExprPtr> unary_filtered() {
    auto e = unary();
    if (!e) return e;
    return filters(*e);
  }
  Result<ExprPtr> unary() {
    if (is_op("-") || is_op("+")) {
      auto e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
      next();
      auto x = unary();
      if (!x) return x;
      e->a = *x;
      return ExprPtr(e);
    }
    auto p = primary();
    if (!p) return p;
    return postfix(*p);
  }
  Status call_args(Expr& e) {
    INFERD_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (peek().kind == Tok::Kind::kName && is_op("=", 1)) {
        std::string name = next().text;
        next();
        auto v = expression();
        if (!v) return v.status();
        e.kwargs.emplace_back(std::move(name), *v);
      } else {
        auto v = expression();
        if (!v) return v.status();
        e.items.push_back(*v);
      }
      if (!is_op(",")) break;
      next();
    }
    return expect_op(")");
  }
  Result<ExprPtr> postfix(ExprPtr base) {
    while (true) {
      if (is_op(".")) {
        next();
        auto name = expect_name();
        if (!name) return name.status();
        auto e = make(Expr::Kind::kAttr);
        e->a = base;
        e->name = *name;
        base = e;
      } else if (is_op("[")) {
        next();
        auto e = make(Expr::Kind::kItem);
        e->a = base;
        // An index, or a slice [start:stop:step] with any part left out.
        ExprPtr parts[3];
        int colons = 0;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) {
            auto x = expression();
            if (!x) return x;
            parts[k] = *x;
          }
          if (is_op(":") && k < 2) {
            next();
            ++colons;
          } else {
            break;
          }
        }
        INFERD_RETURN_IF_ERROR(expect_op("]"));
        if (colons > 0) {
          e->kind = Expr::Kind::kSlice;
          e->items = {parts[0], parts[1]};
          e->c = parts[2];
        } else {
          if (!parts[0]) return syntax_error(e->line, "empty subscript");
          e->b = parts[0];
        }
        base = e;
      } else if (is_op("(")) {
        auto e = make(Expr::Kind::kCall);
        e->a = base;
        INFERD_RETURN_IF_ERROR(call_args(*e));
        base = e;
      } else {
        return base;
      }
    }
  }
  Result<ExprPtr> filters(ExprPtr base) {
    while (true) {
      if (is_op("|")) {
        next();
        auto e = make(Expr::Kind::kFilter);
        auto name = expect_name();
        if (!name) return name.status();
        e->name = *name;
        e->a = base;
        if (is_op("(")) INFERD_RETURN_IF_ERROR(call_args(*e));
        base = e;
      } else if (is_name("is")) {
        next();
        auto e = make(Expr::Kind::kTest);
        if (is_name("not")) {
          next();
          e->negated = true;
        }
        // Tests named by keywords: none, true, false, in; else a name.
        if (peek().kind != Tok::Kind::kName) return syntax_error(peek().line, "expected a test name after 'is'");
        e->name = next().text;
        e->a = base;
        if (is_op("(")) {
          INFERD_RETURN_IF_ERROR(call_args(*e));
        } else if (peek().kind == Tok::Kind::kString || peek().kind == Tok::Kind::kInt ||
                   peek().kind == Tok::Kind::kFloat ||
                   (peek().kind == Tok::Kind::kName && !is_name("and") && !is_name("or") && !is_name("if") &&
                    !is_name("else") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          auto arg = primary();  // "is divisibleby 3", "is equalto 'x'", "is sameas none"
          if (!arg) return arg;
          auto pf = postfix(*arg);
          if (!pf) return pf;
          e->items.push_back(*pf);
        }
        base = e;
      } else {
        return base;
      }
    }
  }
  Result<ExprPtr> primary() {
    const Tok& t = peek();
    switch (t.kind) {
      case Tok::Kind::kString: {
        auto e = make(Expr::Kind::kLiteral);
        std::string s = next().text;
        while (peek().kind == Tok::Kind::kString) s += next().text;  // adjacent literals concatenate
        e->value = Value(std::move(s));
        return ExprPtr(e);
      }
      case Tok::Kind::kInt: {
        auto e = make(Expr::Kind::kLiteral);
        e->value = Value(next().i);
        return ExprPtr(e);
      }
      case Tok::Kind::kFloat: {
        auto e = make(Expr::Kind::kLiteral);
        e->value = Value(next().f);
        return ExprPtr(e);
      }
      case Tok::Kind::kName: {
        auto e = make(Expr::Kind::kLiteral);
        const std::string n = t.text;
        if (n == "true" || n == "True") e->value = Value(true);
        else if (n == "false" || n == "False") e->value = Value(false);
        else if (n == "none" || n == "None") e->value = Value::none();
        else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        next();
        return ExprPtr(e);
      }
      case Tok::Kind::kOp: {
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return ExprPtr(make(Expr::Kind::kTuple));
          }
          auto inner = tuple_or_expression();
          if (!inner) return inner;
          INFERD_RETURN_IF_ERROR(expect_op(")"));
          return inner;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::kList);
          next();
          while (!is_op("]")) {
            auto x = expression();
            if (!x) return x;
            e->items.push_back(*x);
            if (!is_op(",")) break;
            next();
          }
          INFERD_RETURN_IF_ERROR(expect_op("]"));
          return ExprPtr(e);
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::kDict);
          next();
          while (!is_op("}")) {
            auto k = expression();
            if (!k) return k;
            INFERD_RETURN_IF_ERROR(expect_op(":"));
            auto v = expression();
            if (!v) return v;
            e->items.push_back(*k);
            e->items.push_back(*v);
            if (!is_op(",")) break;
            next();
          }
          INFERD_RETURN_IF_ERROR(expect_op("}"));
          return ExprPtr(e);
        }
        break;
      }
      case Tok::Kind::kEnd: break;
    }
    return syntax_error(t.line, "unexpected " + describe(t) + " in an expression");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segs) : s_(std::move(segs)) {}

  Result<NodePtr> parse_all() {
    auto body = parse_body({});
    if (!body) return body;
    if (pos_ < s_.size()) {
      return syntax_error(s_[pos_].line, "unexpected '" + first_word(s_[pos_].text) + "'");
    }
    return body;
  }

 private:
  static std::string first_word(const std::string& s) {
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string::npos) return "";
    size_t b = a;
    while (b < s.size() && (std::isalnum(static_cast<unsigned char>(s[b])) || s[b] == '_')) ++b;
    return s.substr(a, std::max<size_t>(b - a, 1));
  }

  // Parses nodes until a statement whose first word is in `stops` (left unconsumed), or the end.
  Result<NodePtr> parse_body(std::initializer_list<std::string_view> stops) {
    auto body = std::make_shared<Node>();
    body->kind = Node::Kind::kBody;
    while (pos_ < s_.size()) {
      const Segment& seg = s_[pos_];
      switch (seg.kind) {
        case Segment::Kind::kComment: ++pos_; break;
        case Segment::Kind::kText: {
          if (!seg.text.empty()) {
            auto n = std::make_shared<Node>();
            n->kind = Node::Kind::kText;
            n->text = seg.text;
            body->body.push_back(n);
          }
          ++pos_;
          break;
        }
        case Segment::Kind::kOutput: {
          auto toks = lex_expression(seg.text, seg.line);
          if (!toks) return toks.status();
          ExprParser p(std::move(toks).value());
          auto e = p.expression();
          if (!e) return e.status();
          if (!p.at_end()) return syntax_error(p.peek().line, "unexpected " + ExprParser::describe(p.peek()) + " in {{ }}");
          auto n = std::make_shared<Node>();
          n->kind = Node::Kind::kOutput;
          n->line = seg.line;
          n->expr = *e;
          body->body.push_back(n);
          ++pos_;
          break;
        }
        case Segment::Kind::kStatement: {
          const std::string word = first_word(seg.text);
          for (std::string_view stop : stops) {
            if (word == stop) return body;
          }
          auto n = parse_statement();
          if (!n) return n.status();
          if (*n) body->body.push_back(*n);
          break;
        }
      }
    }
    if (stops.size() > 0) {
      return syntax_error(s_.empty() ? 0 : s_.back().line,
                          "the template ends inside a block: missing '{% " + std::string(*stops.begin()) + " %}'");
    }
    return body;
  }

  // The tag's tokens, past its keyword.
  Result<ExprParser> statement_tokens(const Segment& seg) {
    auto toks = lex_expression(seg.text, seg.line);
    if (!toks) return toks.status();
    ExprParser p(std::move(toks).value());
    p.next();
    return p;
  }

  Status expect_end(ExprParser& p, const char* what) {
    if (!p.at_end()) return syntax_error(p.peek().line, std::string("unexpected ") + ExprParser::describe(p.peek()) + " in " + what);
    return Status::ok();
  }

  Result<NodePtr> parse_statement() {
    const Segment& seg = s_[pos_];
    const std::string word = first_word(seg.text);
    auto node = std::make_shared<Node>();
    node->line = seg.line;
    auto pr = statement_tokens(seg);
    if (!pr) return pr.status();
    ExprParser& p = pr.value();
    ++pos_;
    if (word == "if") {
      node->kind = Node::Kind::kIf;
      auto cond = p.expression();
      if (!cond) return cond.status();
      INFERD_RETURN_IF_ERROR(expect_end(p, "{% if %}"));
      node->conditions.push_back(*cond);
      while (true) {
        auto branch = parse_body({"elif", "else", "endif"});
        if (!branch) return branch;
        node->branches.push_back(*branch);
        const Segment& end = s_[pos_];
        const std::string w = first_word(end.text);
        auto ep = statement_tokens(end);
        if (!ep) return ep.status();
        ++pos_;
        if (w == "elif") {
          auto c = ep->expression();
          if (!c) return c.status();
          INFERD_RETURN_IF_ERROR(expect_end(*ep, "{% elif %}"));
          node->conditions.push_back(*c);
          continue;
        }
        INFERD_RETURN_IF_ERROR(expect_end(*ep, w == "else" ? "{% else %}" : "{% endif %}"));
        if (w == "else") {
          auto other = parse_body({"endif"});
          if (!other) return other;
          node->else_branch = *other;
          ++pos_;
        }
        return NodePtr(node);
      }
    }
    if (word == "for") {
      node->kind = Node::Kind::kFor;
      do {
        auto n = p.expect_name();
        if (!n) return n.status();
        node->targets.push_back(*n);
        if (!p.is_op(",")) break;
        p.next();
      } while (true);
      if (!p.is_name("in")) return syntax_error(p.peek().line, "expected 'in' in {% for %}");
      p.next();
      // The iterable stops before an "if" filter (the conditional expression's "if" would take it).
      auto it = p.expression_no_cond();
      if (!it) return it.status();
      node->expr = *it;
      if (p.is_name("if")) {
        p.next();
        auto f = p.expression();
        if (!f) return f.status();
        node->filter = *f;
      }
      if (p.is_name("recursive")) return syntax_error(seg.line, "recursive for loops are not supported");
      INFERD_RETURN_IF_ERROR(expect_end(p, "{% for %}"));
      auto body = parse_body({"else", "endfor"});
      if (!body) return body;
      node->branches.push_back(*body);
      if (first_word(s_[pos_].text) == "else") {
        ++pos_;
        auto other = parse_body({"endfor"});
        if (!other) return other;
        node->else_branch = *other;
      }
      ++pos_;
      return NodePtr(node);
    }
    if (word == "set") {
      auto n = p.expect_name();
      if (!n) return n.status();
      node->name = *n;
      if (p.is_op(".")) {
        p.next();
        auto a = p.expect_name();
        if (!a) return a.status();
        node->attr = *a;
      }
      if (p.is_op(",")) return syntax_error(seg.line, "{% set a, b = ... %} (tuple assignment) is not supported");
      if (p.at_end()) {  // {% set x %}...{% endset %}
        node->kind = Node::Kind::kSetBlock;
        auto body = parse_body({"endset"});
        if (!body) return body;
        node->branches.push_back(*body);
        ++pos_;
        return NodePtr(node);
      }
      node->kind = Node::Kind::kSet;
      INFERD_RETURN_IF_ERROR(p.expect_op("="));
      auto v = p.tuple_or_expression();
      if (!v) return v.status();
      node->expr = *v;
      INFERD_RETURN_IF_ERROR(expect_end(p, "{% set %}"));
      return NodePtr(node);
    }
    if (word == "macro") {
      node->kind = Node::Kind::kMacro;
      auto n = p.expect_name();
      if (!n) return n.status();
      node->name = *n;
      INFERD_RETURN_IF_ERROR(p.expect_op("("));
      while (!p.is_op(")")) {
        auto param = p.expect_name();
        if (!param) return param.status();
        ExprPtr def;
        if (p.is_op("=")) {
          p.next();
          auto d = p.expression();
          if (!d) return d.status();
          def = *d;
        }
        node->params.emplace_back(*param, def);
        if (!p.is_op(",")) break;
        p.next();
      }
      INFERD_RETURN_IF_ERROR(p.expect_op(")"));
      INFERD_RETURN_IF_ERROR(expect_end(p, "{% macro %}"));
      auto body = parse_body({"endmacro"});
      if (!body) return body;
      node->branches.push_back(*body);
      ++pos_;
      return NodePtr(node);
    }
    if (word == "break" || word == "continue") {
      INFERD_RETURN_IF_ERROR(expect_end(p, word == "break" ? "{% break %}" : "{% continue %}"));
      node->kind = word == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      return NodePtr(node);
    }
    if (word == "generation") {  // transformers' {% generation %} marks the assistant's text: rendered as is
      auto body = parse_body({"endgeneration"});
      if (!body) return body;
      ++pos_;
      return *body;
    }
    return syntax_error(seg.line, "the tag '{% " + word + " %}' is not supported");
  }


  std::vector<Segment> s_;
  size_t pos_ = 0;
};

// ---- Evaluation --------------------------------------------------------------------------------------

Status eval_error(int line, const std::string& what) {
  return Status(Code::kInvalidArgument, "chat template, line " + std::to_string(line) + ": " + what);
}

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kArray: return "list";
    case Value::Kind::kObject: return v.object().is_namespace ? "Namespace" : "dict";
    case Value::Kind::kFunction: return "function";
  }
  return "?";
}

// UTF-8 code points of a string (Python indexes strings by code point).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars.is_string() ? chars.str().find(c) != std::string::npos : is_space(c);
  };
  size_t a = 0, b = s.size();
  if (left) {
    while (a < b && drop(s[a])) ++a;
  }
  if (right) {
    while (b > a && drop(s[b - 1])) --b;
  }
  return s.substr(a, b - a);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    c = static_cast<char>(alpha ? (start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c))) : c);
    start = !alpha;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    std::string out;
    int64_t n = 0;
    for (const std::string& cp : code_points(s)) {
      if (count < 0 || n++ < count) out += to;
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t i = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    ++n;
  }
  out.append(s, i, std::string::npos);
  return out;
}

Result<Array> split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace, none at the ends
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        rest.erase(rest.find_last_not_of(" \t\n\r\v\f") + 1);
        out.push_back(Value(rest));
        return out;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  if (!sep.is_string() || sep.str().empty()) return Status(Code::kInvalidArgument, "split: empty separator");
  size_t i = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t j = s.find(sep.str(), i);
    if (j == std::string::npos) break;
    out.push_back(Value(s.substr(i, j - i)));
    i = j + sep.str().size();
  }
  out.push_back(Value(s.substr(i)));
  return out;
}

// Python's sequence indexing: negative from the end; nullopt when out of range.
std::optional<size_t> py_index(int64_t i, size_t n) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
  return static_cast<size_t>(i);
}

// Python's slice indices for a sequence of n elements.
std::vector<size_t> py_slice(const Value& start, const Value& stop, const Value& step_v, size_t n, Status& st) {
  std::vector<size_t> idx;
  const int64_t len = static_cast<int64_t>(n);
  int64_t step = step_v.is_undefined() || step_v.is_none() ? 1 : step_v.integer();
  if (step == 0) {
    st = Status(Code::kInvalidArgument, "slice step cannot be zero");
    return idx;
  }
  auto clamp = [&](const Value& v, int64_t dflt, bool is_start) -> int64_t {
    if (v.is_undefined() || v.is_none()) return dflt;
    int64_t i = v.integer();
    if (i < 0) i += len;
    if (step > 0) return std::clamp<int64_t>(i, 0, len);
    (void)is_start;
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  if (step > 0) {
    const int64_t a = clamp(start, 0, true), b = clamp(stop, len, false);
    for (int64_t i = a; i < b; i += step) idx.push_back(static_cast<size_t>(i));
  } else {
    const int64_t a = clamp(start, len - 1, true), b = clamp(stop, -1, false);
    for (int64_t i = a; i > b; i += step) idx.push_back(static_cast<size_t>(i));
  }
  return idx;
}

Result<Array> iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return Array{};
    case Value::Kind::kArray: return v.array();
    case Value::Kind::kObject: {
      Array keys;
      for (const auto& kv : v.object().items) keys.push_back(Value(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      for (std::string& cp : code_points(v.str())) chars.push_back(Value(std::move(cp)));
      return chars;
    }
    default: return eval_error(line, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

Result<int64_t> length(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return int64_t{0};
    case Value::Kind::kString: return static_cast<int64_t>(code_points(v.str()).size());
    case Value::Kind::kArray: return static_cast<int64_t>(v.array().size());
    case Value::Kind::kObject: return static_cast<int64_t>(v.object().items.size());
    default: return eval_error(line, std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

// Python's ordering for sort and min/max: numbers, strings, lists (lexicographically), else an error.
Result<int> compare(const Value& a, const Value& b, int line) {
  if ((a.is_number() || a.kind() == Value::Kind::kBool) && (b.is_number() || b.kind() == Value::Kind::kBool)) {
    const double x = a.kind() == Value::Kind::kBool ? a.boolean() : a.number();
    const double y = b.kind() == Value::Kind::kBool ? b.boolean() : b.number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < std::min(a.array().size(), b.array().size()); ++i) {
      auto c = compare(a.array()[i], b.array()[i], line);
      if (!c || *c != 0) return c;
    }
    return a.array().size() < b.array().size() ? -1 : a.array().size() > b.array().size() ? 1 : 0;
  }
  return eval_error(line, std::string("'<' is not supported between '") + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

constexpr int64_t kMaxRange = 100000;          // jinja2's sandbox limit on range()
constexpr size_t kMaxOutput = 16u << 20;       // a rendered prompt larger than this is an error
constexpr int kMaxDepth = 200;                 // nested calls and blocks

class Renderer {
 public:
  Renderer(const Value& context, int64_t now, const RenderLimits& limits)
      : context_(context), now_(now), max_steps_(limits.max_steps) {
    scopes_.emplace_back();
  }

  Status render(const Node& n, std::string& out) {
    if (++steps_ > max_steps_) return eval_error(n.line, "the template takes too many steps to render");
    if (++depth_ > kMaxDepth) return eval_error(n.line, "the template nests too deeply");
    Status st = render_inner(n, out);
    --depth_;
    if (st && out.size() > kMaxOutput) return eval_error(n.line, "the rendered text exceeds 16 MiB");
    return st;
  }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  Status render_inner(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kBody:
        for (const NodePtr& c : n.body) {
          INFERD_RETURN_IF_ERROR(render(*c, out));
          if (flow_ != Flow::kNormal) return Status::ok();
        }
        return Status::ok();
      case Node::Kind::kText: out += n.text; return Status::ok();
      case Node::Kind::kOutput: {
        auto v = eval(*n.expr);
        if (!v) return v.status();
        out += v->to_string();
        return Status::ok();
      }
      case Node::Kind::kIf:
        for (size_t i = 0; i < n.conditions.size(); ++i) {
          auto c = eval(*n.conditions[i]);
          if (!c) return c.status();
          if (c->truthy()) return render(*n.branches[i], out);
        }
        return n.else_branch ? render(*n.else_branch, out) : Status::ok();
      case Node::Kind::kFor: return render_for(n, out);
      case Node::Kind::kSet: {
        auto v = eval(*n.expr);
        if (!v) return v.status();
        return assign(n, std::move(v).value());
      }
      case Node::Kind::kSetBlock: {
        std::string text;
        INFERD_RETURN_IF_ERROR(render(*n.branches[0], text));
        return assign(n, Value(std::move(text)));
      }
      case Node::Kind::kMacro: {
        const Node* macro = &n;
        scopes_.back()[n.name] = Value::function([this, macro](Call& c) { return call_macro(*macro, c); });
        return Status::ok();
      }
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loops_ == 0) return eval_error(n.line, "break or continue outside a loop");
        flow_ = n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        return Status::ok();
    }
    return Status::ok();
  }

  Status assign(const Node& n, Value v) {
    if (n.attr.empty()) {
      scopes_.back()[n.name] = std::move(v);
      return Status::ok();
    }
    const Value target = lookup(n.name);
    if (!target.is_object() || !target.object().is_namespace) {
      return eval_error(n.line, "{% set " + n.name + "." + n.attr + " %}: '" + n.name + "' is not a namespace");
    }
    target.object().set(n.attr, std::move(v));
    return Status::ok();
  }

  Status render_for(const Node& n, std::string& out) {
    auto it = eval(*n.expr);
    if (!it) return it.status();
    auto items = iterate(*it, n.line);
    if (!items) return items.status();
    // The filter sees each item with the loop's targets bound (jinja2 filters before loop.* is counted).
    Array kept;
    for (const Value& item : *items) {
      if (!n.filter) {
        kept.push_back(item);
        continue;
      }
      scopes_.emplace_back();
      INFERD_RETURN_IF_ERROR(bind_targets(n, item));
      auto keep = eval(*n.filter);
      scopes_.pop_back();
      if (!keep) return keep.status();
      if (keep->truthy()) kept.push_back(item);
    }
    if (kept.empty()) return n.else_branch ? render(*n.else_branch, out) : Status::ok();
    ++loops_;
    const int64_t count = static_cast<int64_t>(kept.size());
    Status st;
    for (int64_t i = 0; i < count; ++i) {
      scopes_.emplace_back();
      st = bind_targets(n, kept[static_cast<size_t>(i)]);
      if (st) {
        Object loop;
        loop.set("index", Value(i + 1));
        loop.set("index0", Value(i));
        loop.set("revindex", Value(count - i));
        loop.set("revindex0", Value(count - i - 1));
        loop.set("first", Value(i == 0));
        loop.set("last", Value(i == count - 1));
        loop.set("length", Value(count));
        loop.set("depth", Value(int64_t{1}));
        loop.set("depth0", Value(int64_t{0}));
        loop.set("previtem", i > 0 ? kept[static_cast<size_t>(i - 1)] : Value());
        loop.set("nextitem", i + 1 < count ? kept[static_cast<size_t>(i + 1)] : Value());
        loop.set("cycle", Value::function([i](Call& c) -> Result<Value> {
          if (c.args.empty()) return Status(Code::kInvalidArgument, "loop.cycle() needs arguments");
          return c.args[static_cast<size_t>(i) % c.args.size()];
        }));
        scopes_.back()["loop"] = Value(std::move(loop));
        st = render(*n.branches[0], out);
      }
      scopes_.pop_back();
      if (!st) break;
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    --loops_;
    return st;
  }

  Status bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return Status::ok();
    }
    auto parts = iterate(item, n.line);
    if (!parts) return parts.status();
    if (parts->size() != n.targets.size()) {
      return eval_error(n.line, "cannot unpack " + std::to_string(parts->size()) + " values into " +
                                    std::to_string(n.targets.size()) + " loop variables");
    }
    for (size_t k = 0; k < parts->size(); ++k) scopes_.back()[n.targets[k]] = (*parts)[k];
    return Status::ok();
  }

  Result<Value> call_macro(const Node& m, Call& c) {
    if (c.args.size() > m.params.size()) {
      return eval_error(m.line, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments");
    }
    std::map<std::string, Value> frame;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [name, def] = m.params[i];
      const Value& given = c.arg(i, name);
      if (!given.is_undefined()) {
        frame[name] = given;
      } else if (def) {
        auto d = eval(*def);
        if (!d) return d.status();
        frame[name] = *d;
      }
    }
    // A macro sees the template's globals and its arguments, not its caller's locals.
    std::vector<std::map<std::string, Value>> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved.front());
    scopes_.push_back(std::move(frame));
    const int loops = loops_;
    loops_ = 0;
    std::string text;
    Status st = render(*m.branches[0], text);
    loops_ = loops;
    flow_ = Flow::kNormal;
    saved.front() = std::move(scopes_.front());  // {% set %} at the macro's top level stays local in jinja2
    scopes_.swap(saved);
    if (!st) return st;
    return Value(std::move(text));
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (context_.is_object()) {
      if (const Value* v = context_.object().find(name)) return *v;
    }
    return builtin(name);
  }

  Value builtin(const std::string& name) const {
    if (name == "range") {
      return Value::function([](Call& c) -> Result<Value> {
        int64_t a = 0, b = 0, step = 1;
        for (const Value& v : c.args) {
          if (v.kind() != Value::Kind::kInt) return Status(Code::kInvalidArgument, "range() takes integers");
        }
        if (c.args.size() == 1) b = c.args[0].integer();
        else if (c.args.size() >= 2) a = c.args[0].integer(), b = c.args[1].integer();
        if (c.args.size() == 3) step = c.args[2].integer();
        if (c.args.empty() || c.args.size() > 3 || step == 0) return Status(Code::kInvalidArgument, "range(): bad arguments");
        Array out;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step) {
          if (static_cast<int64_t>(out.size()) >= kMaxRange) {
            return Status(Code::kInvalidArgument, "range() is limited to 100000 items");
          }
          out.push_back(Value(i));
        }
        return Value(std::move(out));
      });
    }
    if (name == "namespace") {
      return Value::function([](Call& c) -> Result<Value> {
        Object o;
        o.is_namespace = true;
        if (!c.args.empty() && c.args[0].is_object()) o.items = c.args[0].object().items;
        for (auto& [k, v] : c.kwargs) o.set(k, v);
        return Value(std::move(o));
      });
    }
    if (name == "dict") {
      return Value::function([](Call& c) -> Result<Value> {
        Object o;
        if (!c.args.empty() && c.args[0].is_object()) o.items = c.args[0].object().items;
        for (auto& [k, v] : c.kwargs) o.set(k, v);
        return Value(std::move(o));
      });
    }
    if (name == "raise_exception") {
      return Value::function([](Call& c) -> Result<Value> {
        return Status(Code::kInvalidArgument, "the chat template refused the messages: " + c.arg(0).to_string());
      });
    }
    if (name == "strftime_now") {
      const int64_t now = now_;
      return Value::function([now](Call& c) -> Result<Value> {
        if (!c.arg(0).is_string()) return Status(Code::kInvalidArgument, "strftime_now() takes a format string");
        const std::time_t t = static_cast<std::time_t>(now);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), c.arg(0).str().c_str(), &tm);
        return Value(std::string(buf, n));
      });
    }
    return Value();
  }

  Result<Value> eval(const Expr& e) {
    if (++steps_ > max_steps_) return eval_error(e.line, "the template takes too many steps to render");
    if (++depth_ > kMaxDepth) {
      --depth_;
      return eval_error(e.line, "the expression nests too deeply");
    }
    auto r = eval_inner(e);
    --depth_;
    return r;
  }

  Result<Call> eval_args(const Expr& e) {
    Call c;
    for (const ExprPtr& a : e.items) {
      auto v = eval(*a);
      if (!v) return v.status();
      c.args.push_back(std::move(v).value());
    }
    for (const auto& [k, a] : e.kwargs) {
      auto v = eval(*a);
      if (!v) return v.status();
      c.kwargs.emplace_back(k, std::move(v).value());
    }
    return c;
  }

  Result<Value> eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.value;
      case Expr::Kind::kName: return lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Array a;
        for (const ExprPtr& x : e.items) {
          auto v = eval(*x);
          if (!v) return v;
          a.push_back(std::move(v).value());
        }
        return Value(std::move(a));
      }
      case Expr::Kind::kDict: {
        Object o;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          auto k = eval(*e.items[i]);
          if (!k) return k;
          auto v = eval(*e.items[i + 1]);
          if (!v) return v;
          if (!k->is_string()) return eval_error(e.line, "dict keys must be strings");
          o.set(k->str(), std::move(v).value());
        }
        return Value(std::move(o));
      }
      case Expr::Kind::kAttr: {
        auto obj = eval(*e.a);
        if (!obj) return obj;
        return attribute(*obj, e.name, e.line, /*item_first=*/false);
      }
      case Expr::Kind::kItem: {
        auto obj = eval(*e.a);
        if (!obj) return obj;
        auto key = eval(*e.b);
        if (!key) return key;
        return item(*obj, *key, e.line);
      }
      case Expr::Kind::kSlice: {
        auto obj = eval(*e.a);
        if (!obj) return obj;
        Value parts[3];
        const ExprPtr exprs[3] = {e.items[0], e.items[1], e.c};
        for (int k = 0; k < 3; ++k) {
          if (!exprs[k]) continue;
          auto v = eval(*exprs[k]);
          if (!v) return v;
          if (!v->is_none() && v->kind() != Value::Kind::kInt) return eval_error(e.line, "slice indices must be integers");
          parts[k] = *v;
        }
        Status st;
        if (obj->is_array()) {
          auto idx = py_slice(parts[0], parts[1], parts[2], obj->array().size(), st);
          if (!st) return eval_error(e.line, st.message());
          Array out;
          for (size_t i : idx) out.push_back(obj->array()[i]);
          return Value(std::move(out));
        }
        if (obj->is_string()) {
          const auto cps = code_points(obj->str());
          auto idx = py_slice(parts[0], parts[1], parts[2], cps.size(), st);
          if (!st) return eval_error(e.line, st.message());
          std::string out;
          for (size_t i : idx) out += cps[i];
          return Value(std::move(out));
        }
        return eval_error(e.line, std::string("'") + type_name(*obj) + "' object is not subscriptable");
      }
      case Expr::Kind::kCall: {
        // Methods are looked up as bound functions by kAttr; everything callable is a Function.
        auto callee = eval(*e.a);
        if (!callee) return callee;
        auto c = eval_args(e);
        if (!c) return c.status();
        if (callee->kind() != Value::Kind::kFunction) {
          const std::string what = e.a->kind == Expr::Kind::kName ? "'" + e.a->name + "'"
                                   : e.a->kind == Expr::Kind::kAttr ? "'" + e.a->name + "'"
                                                                    : "the value";
          if (callee->is_undefined()) return eval_error(e.line, what + " is undefined (not a known function or method)");
          return eval_error(e.line, what + " is not callable");
        }
        auto r = callee->fn()(*c);
        if (!r && r.status().message().rfind("chat template", 0) != 0) {
          return eval_error(e.line, r.status().message());
        }
        return r;
      }
      case Expr::Kind::kFilter: {
        auto v = eval(*e.a);
        if (!v) return v;
        auto c = eval_args(e);
        if (!c) return c.status();
        return filter(e.name, std::move(v).value(), *c, e.line);
      }
      case Expr::Kind::kTest: {
        auto v = eval(*e.a);
        if (!v) return v;
        auto c = eval_args(e);
        if (!c) return c.status();
        auto t = test(e.name, *v, *c, e.line);
        if (!t) return t.status();
        return Value(*t != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        auto v = eval(*e.a);
        if (!v) return v;
        if (v->kind() == Value::Kind::kInt) return Value(e.kind == Expr::Kind::kNeg ? -v->integer() : v->integer());
        if (v->kind() == Value::Kind::kFloat) return Value(e.kind == Expr::Kind::kNeg ? -v->number() : v->number());
        return eval_error(e.line, std::string("bad operand type for unary -: '") + type_name(*v) + "'");
      }
      case Expr::Kind::kNot: {
        auto v = eval(*e.a);
        if (!v) return v;
        return Value(!v->truthy());
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        auto l = eval(*e.a);
        if (!l) return l;
        if (e.kind == Expr::Kind::kAnd ? !l->truthy() : l->truthy()) return l;
        return eval(*e.b);
      }
      case Expr::Kind::kCond: {
        auto c = eval(*e.b);
        if (!c) return c;
        if (c->truthy()) return eval(*e.a);
        if (e.c) return eval(*e.c);
        return Value();
      }
      case Expr::Kind::kBinary: {
        auto l = eval(*e.a);
        if (!l) return l;
        auto r = eval(*e.b);
        if (!r) return r;
        return binary(e.name, *l, *r, e.line);
      }
    }
    return Value();
  }

  Result<Value> binary(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "~") return Value(l.to_string() + r.to_string());
    if (op == "==") return Value(l == r);
    if (op == "!=") return Value(!(l == r));
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      auto c = compare(l, r, line);
      if (!c) return c.status();
      return Value(op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0);
    }
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) {
        if (!l.is_string()) return eval_error(line, "'in <string>' requires a string on the left");
        found = r.str().find(l.str()) != std::string::npos;
      } else if (r.is_array()) {
        found = std::find(r.array().begin(), r.array().end(), l) != r.array().end();
      } else if (r.is_object()) {
        found = l.is_string() && r.object().find(l.str()) != nullptr;
      } else if (!r.is_undefined()) {
        return eval_error(line, std::string("argument of type '") + type_name(r) + "' is not iterable");
      }
      return Value(op == "in" ? found : !found);
    }
    auto undefined_operand = [&]() {
      return eval_error(line, std::string("unsupported operand types for ") + op + ": '" + type_name(l) + "' and '" +
                                  type_name(r) + "'");
    };
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value(l.str() + r.str());
      if (l.is_array() && r.is_array()) {
        Array a = l.array();
        a.insert(a.end(), r.array().begin(), r.array().end());
        return Value(std::move(a));
      }
    }
    if (op == "*") {
      const Value& seq = l.is_number() ? r : l;
      const Value& n = l.is_number() ? l : r;
      if (n.kind() == Value::Kind::kInt && (seq.is_string() || seq.is_array())) {
        if (n.integer() * std::max<int64_t>(1, seq.is_string() ? static_cast<int64_t>(seq.str().size())
                                                               : static_cast<int64_t>(seq.array().size())) >
            static_cast<int64_t>(kMaxOutput)) {
          return eval_error(line, "the repeated sequence is too long");
        }
        if (seq.is_string()) {
          std::string out;
          for (int64_t i = 0; i < n.integer(); ++i) out += seq.str();
          return Value(std::move(out));
        }
        Array out;
        for (int64_t i = 0; i < n.integer(); ++i) out.insert(out.end(), seq.array().begin(), seq.array().end());
        return Value(std::move(out));
      }
    }
    auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; };
    if (!numeric(l) || !numeric(r)) return undefined_operand();
    const bool ints = l.kind() != Value::Kind::kFloat && r.kind() != Value::Kind::kFloat;
    const int64_t a = l.kind() == Value::Kind::kBool ? l.boolean() : l.integer();
    const int64_t b = r.kind() == Value::Kind::kBool ? r.boolean() : r.integer();
    const double x = l.kind() == Value::Kind::kBool ? a : l.number(), y = r.kind() == Value::Kind::kBool ? b : r.number();
    if (op == "+") return ints ? Value(a + b) : Value(x + y);
    if (op == "-") return ints ? Value(a - b) : Value(x - y);
    if (op == "*") return ints ? Value(a * b) : Value(x * y);
    if (op == "/") {
      if (y == 0) return eval_error(line, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) return eval_error(line, "integer division or modulo by zero");
      if (ints) {
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(x / y);
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (ints && b >= 0) {
        int64_t p = 1;
        for (int64_t i = 0; i < b && i < 64; ++i) p *= a;
        return Value(p);
      }
      return Value(std::pow(x, y));
    }
    return undefined_operand();
  }

  Result<Value> item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) return eval_error(line, "cannot index an undefined value");
    if (obj.is_object()) {
      if (key.is_string()) {
        if (const Value* v = obj.object().find(key.str())) return *v;
        return attribute(obj, key.str(), line, /*item_first=*/true);
      }
      return Value();
    }
    if (obj.is_array() || obj.is_string()) {
      if (key.kind() != Value::Kind::kInt) {
        if (key.is_string()) return attribute(obj, key.str(), line, true);
        return eval_error(line, "indices must be integers");
      }
      if (obj.is_array()) {
        auto i = py_index(key.integer(), obj.array().size());
        return i ? obj.array()[*i] : Value();
      }
      const auto cps = code_points(obj.str());
      auto i = py_index(key.integer(), cps.size());
      return i ? Value(cps[*i]) : Value();
    }
    if (obj.is_none()) return eval_error(line, "'NoneType' object is not subscriptable");
    return Value();
  }

  // obj.name: a dict's method or key (jinja2 tries the attribute first), a string's or list's method.
  Result<Value> attribute(const Value& obj, const std::string& name, int line, bool item_first) {
    if (obj.is_undefined()) return eval_error(line, "'" + name + "' of an undefined value");
    if (obj.is_none()) return eval_error(line, "'NoneType' object has no attribute '" + name + "'");
    if (obj.is_object() && !item_first) {
      if (!obj.object().is_namespace) {
        Value m = method(obj, name);
        if (!m.is_undefined()) return m;
      }
      if (const Value* v = obj.object().find(name)) return *v;
      return Value();
    }
    return method(obj, name);
  }

  Value method(const Value& obj, const std::string& name) {
    auto bound = [&](auto fn) {
      return Value::function([obj, fn](Call& c) -> Result<Value> { return fn(obj, c); });
    };
    if (obj.is_string()) {
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool l = name != "rstrip", r = name != "lstrip";
        return bound([l, r](const Value& s, Call& c) -> Result<Value> { return Value(strip(s.str(), c.arg(0), l, r)); });
      }
      if (name == "split") {
        return bound([](const Value& s, Call& c) -> Result<Value> {
          const Value& n = c.arg(1, "maxsplit");
          auto parts = split(s.str(), c.arg(0, "sep"), n.kind() == Value::Kind::kInt ? n.integer() : -1);
          if (!parts) return parts.status();
          return Value(std::move(parts).value());
        });
      }
      if (name == "startswith" || name == "endswith") {
        const bool start = name == "startswith";
        return bound([start](const Value& s, Call& c) -> Result<Value> {
          Array options = c.arg(0).is_array() ? c.arg(0).array() : Array{c.arg(0)};
          for (const Value& o : options) {
            if (!o.is_string()) return Status(Code::kInvalidArgument, "startswith/endswith take strings");
            const std::string& p = o.str();
            if (p.size() <= s.str().size() &&
                (start ? s.str().compare(0, p.size(), p) == 0 : s.str().compare(s.str().size() - p.size(), p.size(), p) == 0)) {
              return Value(true);
            }
          }
          return Value(false);
        });
      }
      if (name == "upper" || name == "lower") {
        const bool up = name == "upper";
        return bound([up](const Value& s, Call&) -> Result<Value> { return Value(ascii_case(s.str(), up)); });
      }
      if (name == "title") return bound([](const Value& s, Call&) -> Result<Value> { return Value(title_case(s.str())); });
      if (name == "capitalize") {
        return bound([](const Value& s, Call&) -> Result<Value> {
          std::string t = ascii_case(s.str(), false);
          if (!t.empty()) t[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(t[0])));
          return Value(t);
        });
      }
      if (name == "replace") {
        return bound([](const Value& s, Call& c) -> Result<Value> {
          if (!c.arg(0).is_string() || !c.arg(1).is_string()) return Status(Code::kInvalidArgument, "replace() takes strings");
          const Value& n = c.arg(2, "count");
          return Value(replace_all(s.str(), c.arg(0).str(), c.arg(1).str(), n.kind() == Value::Kind::kInt ? n.integer() : -1));
        });
      }
      if (name == "find" || name == "count") {
        const bool find = name == "find";
        return bound([find](const Value& s, Call& c) -> Result<Value> {
          if (!c.arg(0).is_string()) return Status(Code::kInvalidArgument, "find/count take a string");
          if (find) {
            const size_t at = s.str().find(c.arg(0).str());
            return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_points(s.str().substr(0, at)).size()));
          }
          int64_t n = 0;
          const std::string& p = c.arg(0).str();
          for (size_t at = s.str().find(p); !p.empty() && at != std::string::npos; at = s.str().find(p, at + p.size())) ++n;
          return Value(n);
        });
      }
      if (name == "join") {
        return bound([](const Value& s, Call& c) -> Result<Value> {
          auto items = iterate(c.arg(0), 0);
          if (!items) return items.status();
          std::string out;
          for (size_t i = 0; i < items->size(); ++i) {
            if (!(*items)[i].is_string()) return Status(Code::kInvalidArgument, "str.join() takes strings");
            out += (i ? s.str() : "") + (*items)[i].str();
          }
          return Value(std::move(out));
        });
      }
      if (name == "splitlines") {
        return bound([](const Value& s, Call&) -> Result<Value> {
          Array out;
          std::string cur;
          const std::string& t = s.str();
          for (size_t i = 0; i < t.size(); ++i) {
            if (t[i] == '\n' || t[i] == '\r') {
              out.push_back(Value(cur));
              cur.clear();
              if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
            } else {
              cur += t[i];
            }
          }
          if (!cur.empty()) out.push_back(Value(cur));
          return Value(std::move(out));
        });
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        return bound([name](const Value& s, Call&) -> Result<Value> {
          if (s.str().empty()) return Value(false);
          for (unsigned char ch : s.str()) {
            const bool ok = name == "isdigit" ? std::isdigit(ch) : name == "isspace" ? is_space(static_cast<char>(ch))
                            : name == "isalpha" ? std::isalpha(ch) : std::isalnum(ch);
            if (!ok) return Value(false);
          }
          return Value(true);
        });
      }
      return Value();
    }
    if (obj.is_object()) {
      if (name == "items") {
        return bound([](const Value& o, Call&) -> Result<Value> {
          Array out;
          for (const auto& [k, v] : o.object().items) out.push_back(Value(Array{Value(k), v}));
          return Value(std::move(out));
        });
      }
      if (name == "keys" || name == "values") {
        const bool keys = name == "keys";
        return bound([keys](const Value& o, Call&) -> Result<Value> {
          Array out;
          for (const auto& [k, v] : o.object().items) out.push_back(keys ? Value(k) : v);
          return Value(std::move(out));
        });
      }
      if (name == "get") {
        return bound([](const Value& o, Call& c) -> Result<Value> {
          if (c.arg(0).is_string()) {
            if (const Value* v = o.object().find(c.arg(0).str())) return *v;
          }
          return c.args.size() > 1 ? c.args[1] : Value::none();
        });
      }
      return Value();
    }
    if (obj.is_array()) {
      if (name == "index") {
        return bound([](const Value& a, Call& c) -> Result<Value> {
          auto it = std::find(a.array().begin(), a.array().end(), c.arg(0));
          if (it == a.array().end()) return Status(Code::kInvalidArgument, "list.index(x): x not in list");
          return Value(static_cast<int64_t>(it - a.array().begin()));
        });
      }
      if (name == "count") {
        return bound([](const Value& a, Call& c) -> Result<Value> {
          return Value(static_cast<int64_t>(std::count(a.array().begin(), a.array().end(), c.arg(0))));
        });
      }
    }
    return Value();
  }

  Result<bool> test(const std::string& name, const Value& v, Call& c, int line) {
    const Value& a = c.arg(0);
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind() == Value::Kind::kBool;
    if (name == "true") return v.kind() == Value::Kind::kBool && v.boolean();
    if (name == "false") return v.kind() == Value::Kind::kBool && !v.boolean();
    if (name == "integer") return v.kind() == Value::Kind::kInt;
    if (name == "float") return v.kind() == Value::Kind::kFloat;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_object();
    if (name == "iterable") return v.is_array() || v.is_object() || v.is_string() || v.is_undefined();
    if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
    if (name == "callable") return v.kind() == Value::Kind::kFunction;
    if (name == "equalto" || name == "eq" || name == "sameas") return v == a;
    if (name == "ne") return !(v == a);
    if (name == "lt" || name == "le" || name == "gt" || name == "ge" || name == "lessthan" || name == "greaterthan") {
      auto cmp = compare(v, a, line);
      if (!cmp) return cmp.status();
      if (name == "lt" || name == "lessthan") return *cmp < 0;
      if (name == "le") return *cmp <= 0;
      if (name == "gt" || name == "greaterthan") return *cmp > 0;
      return *cmp >= 0;
    }
    if (name == "in") {
      auto r = binary("in", v, a, line);
      if (!r) return r.status();
      return r->boolean();
    }
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.kind() != Value::Kind::kInt) return eval_error(line, "the '" + name + "' test takes an integer");
      if (name == "odd") return v.integer() % 2 != 0;
      if (name == "even") return v.integer() % 2 == 0;
      if (a.kind() != Value::Kind::kInt || a.integer() == 0) return eval_error(line, "divisibleby needs a non-zero integer");
      return v.integer() % a.integer() == 0;
    }
    if (name == "lower" || name == "upper") {
      return v.is_string() && ascii_case(v.str(), name == "upper") == v.str();
    }
    return eval_error(line, "the test '" + name + "' is not supported");
  }

  // An attribute of an item for selectattr, map, sort, join: "a.b" walks nested keys.
  Result<Value> attr_path(const Value& v, const std::string& path, int line) {
    Value cur = v;
    size_t i = 0;
    while (i <= path.size()) {
      const size_t j = std::min(path.find('.', i), path.size());
      const std::string part = path.substr(i, j - i);
      if (cur.is_undefined()) return Value();
      auto next = std::all_of(part.begin(), part.end(), ::isdigit) && !part.empty() && cur.is_array()
                      ? item(cur, Value(static_cast<int64_t>(std::stoll(part))), line)
                      : item(cur, Value(part), line);
      if (!next) return next;
      cur = *next;
      i = j + 1;
    }
    return cur;
  }

  Result<Value> filter(const std::string& name, Value v, Call& c, int line) {
    const Value& a0 = c.arg(0);
    if (name == "length" || name == "count") {
      auto n = length(v, line);
      if (!n) return n.status();
      return Value(*n);
    }
    if (name == "trim") {
      if (!v.is_string()) v = Value(v.to_string());
      return Value(strip(v.str(), c.arg(0, "chars"), true, true));
    }
    if (name == "tojson") {
      const Value& indent = c.arg(0, "indent");
      auto j = v.to_json(indent.kind() == Value::Kind::kInt ? static_cast<int>(indent.integer()) : -1,
                         c.arg(99, "sort_keys").truthy());
      if (!j) return eval_error(line, j.status().message());
      return Value(std::move(j).value());
    }
    if (name == "upper" || name == "lower") return Value(ascii_case(v.to_string(), name == "upper"));
    if (name == "title") return Value(title_case(v.to_string()));
    if (name == "capitalize") {
      std::string t = ascii_case(v.to_string(), false);
      if (!t.empty()) t[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(t[0])));
      return Value(t);
    }
    if (name == "default" || name == "d") {
      const bool boolean = c.arg(1, "boolean").truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return c.args.empty() && c.arg(0, "default_value").is_undefined()
                                                                  ? Value(std::string())
                                                                  : c.arg(0, "default_value");
      return v;
    }
    if (name == "first" || name == "last") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      if (items->empty()) return Value();
      return name == "first" ? items->front() : items->back();
    }
    if (name == "join") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      const Value& attr = c.arg(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        Value x = (*items)[i];
        if (attr.is_string()) {
          auto y = attr_path(x, attr.str(), line);
          if (!y) return y.status();
          x = *y;
        }
        if (i) out += c.arg(0, "d").to_string();
        out += x.to_string();
      }
      return Value(std::move(out));
    }
    if (name == "replace") {
      if (!a0.is_string() || !c.arg(1).is_string()) return eval_error(line, "replace takes two strings");
      const Value& n = c.arg(2, "count");
      return Value(replace_all(v.to_string(), a0.str(), c.arg(1).str(), n.kind() == Value::Kind::kInt ? n.integer() : -1));
    }
    if (name == "string") return Value(v.to_string());
    if (name == "safe") return v;
    if (name == "escape" || name == "e") return Value(html_escape(v.to_string()));
    if (name == "int") {
      if (v.kind() == Value::Kind::kInt) return v;
      if (v.kind() == Value::Kind::kFloat) return Value(static_cast<int64_t>(v.number()));
      if (v.kind() == Value::Kind::kBool) return Value(static_cast<int64_t>(v.boolean()));
      if (v.is_string()) {
        int64_t out = 0;
        const std::string t = strip(v.str(), Value(), true, true);
        auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
        if (ec == std::errc() && p == t.data() + t.size()) return Value(out);
      }
      return a0.is_undefined() ? Value(int64_t{0}) : a0;
    }
    if (name == "float") {
      if (v.is_number()) return Value(v.number());
      if (v.is_string()) {
        char* end = nullptr;
        const double d = std::strtod(v.str().c_str(), &end);
        if (end && *end == '\0' && !v.str().empty()) return Value(d);
      }
      return a0.is_undefined() ? Value(0.0) : a0;
    }
    if (name == "abs") {
      if (v.kind() == Value::Kind::kInt) return Value(v.integer() < 0 ? -v.integer() : v.integer());
      if (v.kind() == Value::Kind::kFloat) return Value(std::fabs(v.number()));
      return eval_error(line, "abs takes a number");
    }
    if (name == "round") {
      if (!v.is_number()) return eval_error(line, "round takes a number");
      const int64_t precision = a0.kind() == Value::Kind::kInt ? a0.integer() : 0;
      const double scale = std::pow(10.0, static_cast<double>(precision));
      const std::string method = c.arg(1, "method").is_string() ? c.arg(1, "method").str() : "common";
      const double x = v.number() * scale;
      const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
      return Value(r / scale);
    }
    if (name == "list") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      return Value(std::move(items).value());
    }
    if (name == "items" || name == "dictsort") {
      if (v.is_undefined()) return Value(Array{});
      if (!v.is_object()) return eval_error(line, "the '" + name + "' filter takes a dict");
      Array out;
      for (const auto& [k, x] : v.object().items) out.push_back(Value(Array{Value(k), x}));
      if (name == "dictsort") {
        std::stable_sort(out.begin(), out.end(), [](const Value& p, const Value& q) {
          return ascii_case(p.array()[0].str(), false) < ascii_case(q.array()[0].str(), false);
        });
      }
      return Value(std::move(out));
    }
    if (name == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.str());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value(out);
      }
      auto items = iterate(v, line);
      if (!items) return items.status();
      std::reverse(items->begin(), items->end());
      return Value(std::move(items).value());
    }
    if (name == "unique") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      Array out;
      for (const Value& x : *items) {
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "sort") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      const bool reverse = c.arg(0, "reverse").truthy();
      const Value& attr = c.arg(2, "attribute");
      Status st;
      Array sorted = *items;
      std::vector<Value> keys;
      for (const Value& x : sorted) {
        Value k = x;
        if (attr.is_string()) {
          auto y = attr_path(x, attr.str(), line);
          if (!y) return y.status();
          k = *y;
        }
        if (k.is_string() && !c.arg(1, "case_sensitive").truthy()) k = Value(ascii_case(k.str(), false));
        keys.push_back(k);
      }
      std::vector<size_t> order(sorted.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t p, size_t q) {
        auto cmp = compare(keys[p], keys[q], line);
        if (!cmp) {
          st = cmp.status();
          return false;
        }
        return reverse ? *cmp > 0 : *cmp < 0;
      });
      if (!st) return st;
      Array out;
      for (size_t i : order) out.push_back(sorted[i]);
      return Value(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      const bool attr_form = name == "selectattr" || name == "rejectattr";
      const bool keep_true = name == "selectattr" || name == "select";
      size_t next_arg = 0;
      std::string attr;
      if (attr_form) {
        if (!c.arg(0).is_string()) return eval_error(line, name + " needs an attribute name");
        attr = c.arg(0).str();
        next_arg = 1;
      }
      std::string test_name;
      if (c.args.size() > next_arg) {
        if (!c.args[next_arg].is_string()) return eval_error(line, name + ": the test must be named by a string");
        test_name = c.args[next_arg].str();
      }
      Call test_args;
      for (size_t k = next_arg + 1; k < c.args.size(); ++k) test_args.args.push_back(c.args[k]);
      Array out;
      for (const Value& x : *items) {
        Value subject = x;
        if (attr_form) {
          auto y = attr_path(x, attr, line);
          if (!y) return y.status();
          subject = *y;
        }
        bool pass;
        if (test_name.empty()) {
          pass = subject.truthy();
        } else {
          auto t = test(test_name, subject, test_args, line);
          if (!t) return t.status();
          pass = *t;
        }
        if (pass == keep_true) out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "map") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      Array out;
      const Value& attr = c.arg(99, "attribute");
      for (const Value& x : *items) {
        if (attr.is_string()) {
          auto y = attr_path(x, attr.str(), line);
          if (!y) return y.status();
          out.push_back(y->is_undefined() ? c.arg(99, "default") : *y);
        } else if (a0.is_string()) {
          Call rest;
          for (size_t k = 1; k < c.args.size(); ++k) rest.args.push_back(c.args[k]);
          auto y = filter(a0.str(), x, rest, line);
          if (!y) return y.status();
          out.push_back(*y);
        } else {
          return eval_error(line, "map needs attribute= or a filter name");
        }
      }
      return Value(std::move(out));
    }
    if (name == "indent") {
      const Value& w = c.arg(0, "width");
      const std::string pad = w.is_string() ? w.str() : std::string(static_cast<size_t>(w.kind() == Value::Kind::kInt ? std::max<int64_t>(0, std::min<int64_t>(w.integer(), 256)) : 4), ' ');
      const bool first = c.arg(1, "first").truthy(), blank = c.arg(2, "blank").truthy();
      const std::string s = v.to_string();
      std::string out;
      size_t i = 0;
      bool first_line = true;
      while (i <= s.size()) {
        const size_t j = std::min(s.find('\n', i), s.size());
        const std::string ln = s.substr(i, j - i);
        if ((first_line ? first : true) && (blank || !ln.empty())) out += pad;
        out += ln;
        if (j < s.size()) out += '\n';
        first_line = false;
        i = j + 1;
      }
      return Value(std::move(out));
    }
    if (name == "wordcount") {
      auto words = split(v.to_string(), Value(), -1);
      if (!words) return words.status();
      return Value(static_cast<int64_t>(words->size()));
    }
    if (name == "sum" || name == "min" || name == "max") {
      auto items = iterate(v, line);
      if (!items) return items.status();
      const Value& attr = c.arg(99, "attribute");
      std::vector<Value> xs;
      for (const Value& x : *items) {
        if (attr.is_string()) {
          auto y = attr_path(x, attr.str(), line);
          if (!y) return y.status();
          xs.push_back(*y);
        } else {
          xs.push_back(x);
        }
      }
      if (name == "sum") {
        Value acc = c.arg(99, "start").is_undefined() ? Value(int64_t{0}) : c.arg(99, "start");
        for (const Value& x : xs) {
          auto s = binary("+", acc, x, line);
          if (!s) return s;
          acc = *s;
        }
        return acc;
      }
      if (xs.empty()) return Value();
      Value best = xs[0];
      for (size_t i = 1; i < xs.size(); ++i) {
        auto cmp = compare(xs[i], best, line);
        if (!cmp) return cmp.status();
        if (name == "min" ? *cmp < 0 : *cmp > 0) best = xs[i];
      }
      return best;
    }
    return eval_error(line, "the filter '" + name + "' is not supported");
  }

  const Value& context_;
  int64_t now_;
  std::vector<std::map<std::string, Value>> scopes_;
  int depth_ = 0;
  int64_t steps_ = 0;
  int64_t max_steps_;
  int loops_ = 0;
  Flow flow_ = Flow::kNormal;
};

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  auto segs = segment(source);
  if (!segs) return segs.status();
  TemplateParser p(std::move(segs).value());
  auto root = p.parse_all();
  if (!root) return root.status();
  Template t;
  t.root_ = std::move(root).value();
  return t;
}

Result<std::string> Template::render(const Value& context, int64_t now, const RenderLimits& limits) const {
  Renderer r(context, now, limits);
  std::string out;
  INFERD_RETURN_IF_ERROR(r.render(*root_, out));
  return out;
}

}  // namespace inferd::jinja
