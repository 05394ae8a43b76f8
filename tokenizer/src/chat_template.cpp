// The Jinja2 subset of chat templates (kolos/tokenizer/chat_template.h).
//
// Three passes: the source is cut into text and tags, with Jinja's
// whitespace rules applied to the text (`-` on a tag strips the
// whitespace beside it; transformers renders with trim_blocks, which drops
// the first newline after a block tag, and lstrip_blocks, which drops the
// spaces and tabs before a block tag on its line; one trailing newline of
// the source is dropped); the tags are parsed into a tree of statements
// and expressions, refusing what the subset lacks; render() walks the tree.
#include "kolos/tokenizer/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kolos/core/error.h"

namespace kolos::tokenizer {
namespace {

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
// A mapping keeps its keys in insertion order, as Python's dict (tojson
// writes them so).
using Map = std::vector<std::pair<std::string, Value>>;
using Scope = std::map<std::string, Value>;

struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kString, kList, kMap };
  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<const List> list;
  std::shared_ptr<const Map> map;

  static Value none() { return with(Type::kNone); }
  static Value boolean(bool v) {
    Value x = with(Type::kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with(Type::kInt);
    x.i = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = with(Type::kString);
    x.s = std::move(v);
    return x;
  }
  static Value of_list(List v) {
    Value x = with(Type::kList);
    x.list = std::make_shared<const List>(std::move(v));
    return x;
  }
  static Value of_map(Map v) {
    Value x = with(Type::kMap);
    x.map = std::make_shared<const Map>(std::move(v));
    return x;
  }
  static Value with(Type t) {
    Value x;
    x.type = t;
    return x;
  }
};

const char* type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
      return "undefined";
    case Value::Type::kNone:
      return "none";
    case Value::Type::kBool:
      return "boolean";
    case Value::Type::kInt:
      return "integer";
    case Value::Type::kString:
      return "string";
    case Value::Type::kList:
      return "list";
    case Value::Type::kMap:
      return "mapping";
  }
  return "?";
}

Value find_key(const Map& map, const std::string& key) {
  for (const auto& [k, v] : map) {
    if (k == key) return v;
  }
  return Value{};
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return false;
    case Value::Type::kBool:
      return v.b;
    case Value::Type::kInt:
      return v.i != 0;
    case Value::Type::kString:
      return !v.s.empty();
    case Value::Type::kList:
      return !v.list->empty();
    case Value::Type::kMap:
      return !v.map->empty();
  }
  return false;
}

// The UTF-8 characters of `s` (Python's str indexes and counts these).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0) {
      n = 4;
    } else if (c >= 0xE0) {
      n = 3;
    } else if (c >= 0xC0) {
      n = 2;
    }
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, bool left, bool right) {
  size_t a = 0, b = s.size();
  while (left && a < b && is_space(s[a])) ++a;
  while (right && b > a && is_space(s[b - 1])) --b;
  return s.substr(a, b - a);
}

// Python's json.dumps(x, ensure_ascii=False), which transformers' tojson is.
void to_json(const Value& v, std::string& out) {
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(v.i);
      return;
    case Value::Type::kString: {
      out += '"';
      for (const char ch : v.s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (ch) {
          case '"':
            out += "\\\"";
            break;
          case '\\':
            out += "\\\\";
            break;
          case '\n':
            out += "\\n";
            break;
          case '\r':
            out += "\\r";
            break;
          case '\t':
            out += "\\t";
            break;
          case '\b':
            out += "\\b";
            break;
          case '\f':
            out += "\\f";
            break;
          default:
            if (c < 0x20) {
              char buf[8];
              std::snprintf(buf, sizeof buf, "\\u%04x", c);
              out += buf;
            } else {
              out += ch;
            }
        }
      }
      out += '"';
      return;
    }
    case Value::Type::kList: {
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        to_json((*v.list)[k], out);
      }
      out += ']';
      return;
    }
    case Value::Type::kMap: {
      out += '{';
      bool first = true;
      for (const auto& [key, x] : *v.map) {
        if (!first) out += ", ";
        first = false;
        to_json(Value::string(key), out);
        out += ": ";
        to_json(x, out);
      }
      out += '}';
      return;
    }
  }
}

// ---------------------------------------------------------------- the tree

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kList,
    kNot,
    kNeg,
    kAnd,
    kOr,
    kBinary,
    kCompare,
    kIn,
    kCond,
    kFilter,
    kTest,
    kMethod,
    kRaise
  };
  Kind kind = Kind::kLiteral;
  size_t pos = 0;
  Value literal;
  std::string name;                         // variable, attribute, operator, filter, test, method
  bool negate = false;                      // `not in`, `is not`
  std::vector<std::unique_ptr<Expr>> args;  // operands (a slice's may be null)
};
using ExprPtr = std::unique_ptr<Expr>;

struct Node {
  enum class Kind { kText, kOutput, kFor, kIf, kSet };
  Kind kind = Kind::kText;
  size_t pos = 0;
  std::string text;        // kText; the variable of kFor and kSet
  ExprPtr expr;            // kOutput, kSet's value, kFor's sequence
  std::vector<Node> body;  // kFor
  // kIf: (condition, body) in order; a null condition is `else`.
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;
};

// ---------------------------------------------------------------- lexing

struct Tag {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind;
  std::string text;  // the text, or the tag's inside without delimiters and markers
  size_t pos;        // offset of the text, or of the tag's inside, in the source
};

struct Source {
  std::string text, origin;
  std::string where(size_t pos) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < pos && k < text.size(); ++k) {
      if (text[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return origin + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& message) const {
    throw DataError(where(pos) + ": " + message);
  }
};

std::vector<Tag> lex(const Source& src) {
  const std::string& s = src.text;
  std::vector<Tag> tags;
  bool strip_next = false;  // the previous tag ended with `-`
  bool trim_next = false;   // the previous tag was a block tag (trim_blocks)
  size_t at = 0;
  while (at <= s.size()) {
    size_t open = s.find('{', at);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' &&
           s[open + 1] != '%' && s[open + 1] != '#') {
      open = s.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= s.size()) open = std::string::npos;
    std::string text = s.substr(at, (open == std::string::npos ? s.size() : open) - at);
    size_t text_pos = at;
    if (strip_next) {
      const std::string stripped = strip(text, true, false);
      text_pos += text.size() - stripped.size();
      text = stripped;
    } else if (trim_next) {
      if (text.rfind("\n", 0) == 0) {
        text.erase(0, 1);
        ++text_pos;
      } else if (text.rfind("\r\n", 0) == 0) {
        text.erase(0, 2);
        text_pos += 2;
      }
    }
    if (open == std::string::npos) {
      if (!text.empty()) tags.push_back({Tag::Kind::kText, text, text_pos});
      break;
    }
    const char kind = s[open + 1];
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t inner = open + 2;
    const bool block = kind != '{';
    const char marker = inner < s.size() ? s[inner] : '\0';
    if (marker == '-') {
      text = strip(text, false, true);
      ++inner;
    } else if (block && marker == '+') {
      ++inner;  // no lstrip_blocks for this tag
    } else if (block) {
      // lstrip_blocks: spaces and tabs between the line's start and the tag.
      const size_t nl = text.find_last_of('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool at_line_start =
          nl != std::string::npos || text_pos == 0 || s[text_pos - 1] == '\n';
      if (at_line_start && text.find_first_not_of(" \t", from) == std::string::npos) {
        text.erase(from);
      }
    }
    if (!text.empty()) tags.push_back({Tag::Kind::kText, text, text_pos});
    // The end of the tag; string literals may hold the closing delimiter.
    size_t end = inner;
    char quote = 0;
    bool closed = false;
    while (end < s.size()) {
      const char c = s[end];
      if (quote) {
        if (c == '\\') {
          end += 2;
          continue;
        }
        if (c == quote) quote = 0;
      } else if (kind != '#' && (c == '\'' || c == '"')) {
        quote = c;
      } else if (s.compare(end, 2, close) == 0) {
        closed = true;
        break;
      }
      ++end;
    }
    if (!closed) src.fail(open, std::string("`{") + kind + "` is never closed by `" + close + "`");
    size_t inner_end = end;
    strip_next = false;
    trim_next = false;
    if (inner_end > inner && s[inner_end - 1] == '-') {
      strip_next = true;
      --inner_end;
    } else if (block && inner_end > inner && s[inner_end - 1] == '+') {
      --inner_end;
    } else {
      trim_next = block;
    }
    if (kind != '#') {
      tags.push_back({kind == '{' ? Tag::Kind::kOutput : Tag::Kind::kStatement,
                      s.substr(inner, inner_end - inner), inner});
    }
    at = end + 2;
  }
  return tags;
}

// ---------------------------------------------------------------- expressions

struct Token {
  enum class Kind { kName, kInt, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int64_t number = 0;
  size_t pos;
};

std::vector<Token> tokenize(const Source& src, const std::string& s, size_t base) {
  std::vector<Token> out;
  size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (is_space(c)) {
      ++k;
      continue;
    }
    const size_t pos = base + k;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Token::Kind::kName, s.substr(k, e - k), 0, pos});
      k = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      if (e < s.size() && (s[e] == '.' || s[e] == 'e' || s[e] == 'E')) {
        src.fail(pos, "unsupported construct: a floating-point number (integers only)");
      }
      Token t{Token::Kind::kInt, s.substr(k, e - k), 0, pos};
      try {
        t.number = std::stoll(t.text);
      } catch (const std::exception&) {
        src.fail(pos, "the integer " + t.text + " is too large");
      }
      out.push_back(t);
      k = e;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t e = k + 1;
      for (; e < s.size() && s[e] != c; ++e) {
        if (s[e] != '\\' || e + 1 >= s.size()) {
          value += s[e];
          continue;
        }
        const char x = s[++e];
        switch (x) {
          case 'n':
            value += '\n';
            break;
          case 't':
            value += '\t';
            break;
          case 'r':
            value += '\r';
            break;
          case '\\':
            value += '\\';
            break;
          case '\'':
            value += '\'';
            break;
          case '"':
            value += '"';
            break;
          case '\n':
            break;
          default:
            src.fail(base + e - 1, std::string("unsupported construct: the escape `\\") + x +
                                       "` in a string literal (\\n \\t \\r \\\\ \\' \\\" only)");
        }
      }
      if (e >= s.size()) src.fail(pos, "a string literal is never closed");
      out.push_back({Token::Kind::kString, value, 0, pos});
      k = e + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                                   "-",  "*",  "/",  "%",  "~",  "(",  ")", "[", "]",
                                   ".",  ",",  ":",  "|",  "=",  "{",  "}"};
      bool found = false;
      for (const char* op : kOps) {
        const size_t n = std::char_traits<char>::length(op);
        if (s.compare(k, n, op) == 0) {
          out.push_back({Token::Kind::kOp, op, 0, pos});
          k += n;
          found = true;
          break;
        }
      }
      if (!found) src.fail(pos, std::string("unexpected character `") + c + "`");
    }
  }
  out.push_back({Token::Kind::kEnd, "", 0, base + s.size()});
  return out;
}

class ExprParser {
 public:
  ExprParser(const Source& src, std::vector<Token> tokens) : src_(src), t_(std::move(tokens)) {}

  ExprPtr expression() {
    ExprPtr e = or_expr();
    if (is_name("if")) {
      auto c = make(Expr::Kind::kCond, next().pos);
      ExprPtr cond = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = expression();
      } else {
        otherwise = make(Expr::Kind::kLiteral, c->pos);  // undefined, as Jinja's
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      return c;
    }
    return e;
  }

  const Token& peek() const { return t_[k_]; }
  Token next() { return t_[k_ == t_.size() - 1 ? k_ : k_++]; }
  bool is_name(const char* n) const {
    return peek().kind == Token::Kind::kName && peek().text == n;
  }
  bool is_op(const char* o) const { return peek().kind == Token::Kind::kOp && peek().text == o; }
  void expect_op(const char* o) {
    if (!is_op(o)) fail_here(std::string("expected `") + o + "`");
    next();
  }
  std::string name() {
    if (peek().kind != Token::Kind::kName) fail_here("expected a name");
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Token::Kind::kEnd) fail_here("unexpected `" + peek().text + "`");
  }
  [[noreturn]] void fail_here(const std::string& message) const {
    const Token& t = peek();
    src_.fail(t.pos, message + (t.kind == Token::Kind::kEnd ? " at the end of the tag"
                                                            : ", found `" + t.text + "`"));
  }
  [[noreturn]] void unsupported(size_t pos, const std::string& what) const {
    src_.fail(pos,
              "unsupported construct: " + what +
                  " (kolos supports a subset of Jinja2: docs/tokenizers.md, \"Chat templates\")");
  }

 private:
  static ExprPtr make(Expr::Kind kind, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  static ExprPtr binary(Expr::Kind kind, const std::string& op, size_t pos, ExprPtr a, ExprPtr b) {
    auto e = make(kind, pos);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const size_t pos = next().pos;
      e = binary(Expr::Kind::kOr, "or", pos, std::move(e), and_expr());
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const size_t pos = next().pos;
      e = binary(Expr::Kind::kAnd, "and", pos, std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    if (is_name("not")) {
      auto e = make(Expr::Kind::kNot, next().pos);
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = concat();
    bool compared = false;
    while (true) {
      const Token& t = peek();
      const bool cmp =
          t.kind == Token::Kind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                         t.text == ">" || t.text == "<=" || t.text == ">=");
      const bool in = is_name("in") || (is_name("not") && t_[k_ + 1].kind == Token::Kind::kName &&
                                        t_[k_ + 1].text == "in");
      if (!cmp && !in) return e;
      if (compared) unsupported(t.pos, "a chained comparison");
      compared = true;
      const size_t pos = t.pos;
      if (cmp) {
        const std::string op = next().text;
        e = binary(Expr::Kind::kCompare, op, pos, std::move(e), concat());
      } else {
        const bool negate = is_name("not");
        if (negate) next();
        next();
        e = binary(Expr::Kind::kIn, "in", pos, std::move(e), concat());
        e->negate = negate;
      }
    }
  }
  ExprPtr concat() {
    ExprPtr e = sum();
    while (is_op("~")) {
      const size_t pos = next().pos;
      e = binary(Expr::Kind::kBinary, "~", pos, std::move(e), sum());
    }
    return e;
  }
  ExprPtr sum() {
    ExprPtr e = product();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      e = binary(Expr::Kind::kBinary, op.text, op.pos, std::move(e), product());
    }
    return e;
  }
  ExprPtr product() {
    ExprPtr e = unary();
    while (is_op("*") || is_op("%") || is_op("//") || is_op("/") || is_op("**")) {
      const Token op = next();
      if (op.text == "/" || op.text == "**") {
        unsupported(op.pos, "the operator `" + op.text + "` (integers: + - * // % only)");
      }
      e = binary(Expr::Kind::kBinary, op.text, op.pos, std::move(e), unary());
    }
    return e;
  }
  ExprPtr unary() {
    if (is_op("-")) {
      auto e = make(Expr::Kind::kNeg, next().pos);
      e->args.push_back(unary());
      return e;
    }
    return postfix(primary());
  }
  ExprPtr primary() {
    const Token t = next();
    switch (t.kind) {
      case Token::Kind::kInt: {
        auto e = make(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::integer(t.number);
        return e;
      }
      case Token::Kind::kString: {
        auto e = make(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::string(t.text);
        // Adjacent literals concatenate, as in Python.
        while (peek().kind == Token::Kind::kString) e->literal.s += next().text;
        return e;
      }
      case Token::Kind::kName: {
        auto e = make(Expr::Kind::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else if (is_op("(")) {
          if (t.text != "raise_exception") unsupported(t.pos, "the function `" + t.text + "`");
          next();
          e->kind = Expr::Kind::kRaise;
          e->args.push_back(expression());
          expect_op(")");
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.text;
        }
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          ExprPtr e = expression();
          if (is_op(",")) unsupported(peek().pos, "a tuple");
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::kList, t.pos);
          while (!is_op("]")) {
            e->args.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") unsupported(t.pos, "a dict literal");
        break;
      case Token::Kind::kEnd:
        fail_here("expected an expression");
    }
    src_.fail(t.pos, "unexpected `" + t.text + "`");
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const size_t pos = next().pos;
        const std::string attr = name();
        if (is_op("(")) {
          static const char* kMethods[] = {"strip", "lstrip",     "rstrip",  "upper",
                                           "lower", "startswith", "endswith"};
          if (std::find_if(std::begin(kMethods), std::end(kMethods),
                           [&](const char* m) { return attr == m; }) == std::end(kMethods)) {
            unsupported(pos, "the method `" + attr + "()`");
          }
          next();
          auto m = make(Expr::Kind::kMethod, pos);
          m->name = attr;
          m->args.push_back(std::move(e));
          while (!is_op(")")) {
            m->args.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op(")");
          const size_t want = attr == "startswith" || attr == "endswith" ? 2 : 1;
          if (m->args.size() != want) {
            src_.fail(pos, "`" + attr + "()` takes " + std::to_string(want - 1) + " argument" +
                               (want == 2 ? "" : "s"));
          }
          e = std::move(m);
        } else {
          auto a = make(Expr::Kind::kAttr, pos);
          a->name = attr;
          a->args.push_back(std::move(e));
          e = std::move(a);
        }
      } else if (is_op("[")) {
        const size_t pos = next().pos;
        ExprPtr first = is_op(":") ? nullptr : expression();
        if (is_op(":")) {
          next();
          auto s = make(Expr::Kind::kSlice, pos);
          s->args.push_back(std::move(e));
          s->args.push_back(std::move(first));
          s->args.push_back(is_op("]") ? nullptr : expression());
          if (is_op(":")) unsupported(peek().pos, "a slice with a step");
          expect_op("]");
          e = std::move(s);
        } else {
          auto i = make(Expr::Kind::kIndex, pos);
          i->args.push_back(std::move(e));
          i->args.push_back(std::move(first));
          expect_op("]");
          e = std::move(i);
        }
      } else if (is_op("|")) {
        const size_t pos = next().pos;
        const std::string filter = name();
        static const char* kFilters[] = {"trim", "length", "upper", "lower", "string", "tojson"};
        if (std::find_if(std::begin(kFilters), std::end(kFilters),
                         [&](const char* f) { return filter == f; }) == std::end(kFilters)) {
          unsupported(pos, "the filter `" + filter + "`");
        }
        if (is_op("(")) unsupported(peek().pos, "arguments to the filter `" + filter + "`");
        auto f = make(Expr::Kind::kFilter, pos);
        f->name = filter;
        f->args.push_back(std::move(e));
        e = std::move(f);
      } else if (is_name("is")) {
        const size_t pos = next().pos;
        const bool negate = is_name("not");
        if (negate) next();
        const std::string test = name();
        if (test != "defined" && test != "undefined" && test != "none" && test != "string") {
          unsupported(pos, "the test `is " + test + "`");
        }
        auto t = make(Expr::Kind::kTest, pos);
        t->name = test;
        t->negate = negate;
        t->args.push_back(std::move(e));
        e = std::move(t);
      } else if (is_op("(")) {
        unsupported(peek().pos, "a call of this expression");
      } else {
        return e;
      }
    }
  }

  const Source& src_;
  std::vector<Token> t_;
  size_t k_ = 0;
};

// ---------------------------------------------------------------- statements

class Parser {
 public:
  Parser(const Source& src, std::vector<Tag> tags) : src_(src), tags_(std::move(tags)) {}

  std::vector<Node> parse() {
    std::string end;
    std::vector<Node> nodes = block({}, end);
    return nodes;
  }

 private:
  // Statements until one of `ends` (a tag keyword: "endfor", "elif", ...);
  // that keyword is left in `found` and its tag's parser in parser_.
  std::vector<Node> block(const std::vector<std::string>& ends, std::string& found) {
    std::vector<Node> nodes;
    while (k_ < tags_.size()) {
      const Tag& tag = tags_[k_++];
      if (tag.kind == Tag::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.pos = tag.pos;
        n.text = tag.text;
        nodes.push_back(std::move(n));
        continue;
      }
      auto p = std::make_unique<ExprParser>(src_, tokenize(src_, tag.text, tag.pos));
      if (tag.kind == Tag::Kind::kOutput) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.pos = tag.pos;
        n.expr = p->expression();
        p->expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      if (p->peek().kind != Token::Kind::kName) p->fail_here("expected a statement");
      const Token keyword = p->next();
      const std::string& kw = keyword.text;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        found = kw;
        parser_ = std::move(p);
        return nodes;
      }
      if (kw == "for") {
        nodes.push_back(for_statement(*p, keyword.pos));
      } else if (kw == "if") {
        nodes.push_back(if_statement(std::move(p), keyword.pos));
      } else if (kw == "set") {
        Node n;
        n.kind = Node::Kind::kSet;
        n.pos = keyword.pos;
        n.text = p->name();
        if (p->is_op(".") || p->is_op(","))
          p->unsupported(p->peek().pos, "assigning to `" + n.text + p->peek().text + "...`");
        if (!p->is_op("="))
          p->unsupported(p->peek().pos, "a `{% set %}` block (`{% set x = value %}` only)");
        p->next();
        n.expr = p->expression();
        p->expect_end();
        nodes.push_back(std::move(n));
      } else if (kw == "endfor" || kw == "endif" || kw == "elif" || kw == "else") {
        src_.fail(keyword.pos, "`{% " + kw + " %}` without its opening tag");
      } else {
        p->unsupported(keyword.pos, "the statement `{% " + kw + " %}`");
      }
    }
    if (!ends.empty()) {
      src_.fail(src_.text.size(),
                "the template ends inside a block: expected `{% " + ends.back() + " %}`");
    }
    return nodes;
  }

  Node for_statement(ExprParser& p, size_t pos) {
    Node n;
    n.kind = Node::Kind::kFor;
    n.pos = pos;
    n.text = p.name();
    if (p.is_op(",")) p.unsupported(p.peek().pos, "unpacking in a for loop (one variable only)");
    if (!p.is_name("in")) p.fail_here("expected `in`");
    p.next();
    n.expr = p.expression();
    if (p.is_name("recursive")) p.unsupported(p.peek().pos, "a recursive loop");
    p.expect_end();
    std::string found;
    n.body = block({"endfor", "else"}, found);
    if (found == "else") p.unsupported(parser_->peek().pos, "`{% else %}` in a for loop");
    parser_->expect_end();
    return n;
  }

  Node if_statement(std::unique_ptr<ExprParser> p, size_t pos) {
    Node n;
    n.kind = Node::Kind::kIf;
    n.pos = pos;
    ExprPtr cond = p->expression();
    p->expect_end();
    while (true) {
      std::string found;
      std::vector<Node> body = block({"elif", "else", "endif"}, found);
      n.branches.emplace_back(std::move(cond), std::move(body));
      if (found == "endif") {
        parser_->expect_end();
        return n;
      }
      if (found == "else") {
        parser_->expect_end();
        std::vector<Node> rest = block({"endif"}, found);
        parser_->expect_end();
        n.branches.emplace_back(nullptr, std::move(rest));
        return n;
      }
      cond = parser_->expression();  // elif
      parser_->expect_end();
    }
  }

  const Source& src_;
  std::vector<Tag> tags_;
  size_t k_ = 0;
  std::unique_ptr<ExprParser> parser_;  // of the tag that ended the last block
};

// ---------------------------------------------------------------- rendering

class Renderer {
 public:
  Renderer(const Source& src, std::vector<Scope> scopes) : src_(src), scopes_(std::move(scopes)) {}

  void run(const std::vector<Node>& nodes, std::string& out) {
    for (const Node& n : nodes) {
      switch (n.kind) {
        case Node::Kind::kText:
          out += n.text;
          break;
        case Node::Kind::kOutput:
          out += text_of(eval(*n.expr), n.expr->pos);
          break;
        case Node::Kind::kSet:
          scopes_.back()[n.text] = eval(*n.expr);
          break;
        case Node::Kind::kIf:
          for (const auto& [cond, body] : n.branches) {
            if (!cond || truthy(eval(*cond))) {
              run(body, out);
              break;
            }
          }
          break;
        case Node::Kind::kFor: {
          const Value seq = eval(*n.expr);
          List items;
          if (seq.type == Value::Type::kList) {
            items = *seq.list;
          } else if (seq.type == Value::Type::kString) {
            for (auto& c : characters(seq.s)) items.push_back(Value::string(c));
          } else if (seq.type == Value::Type::kMap) {
            for (const auto& kv : *seq.map) items.push_back(Value::string(kv.first));
          } else if (seq.type != Value::Type::kUndefined) {
            src_.fail(n.expr->pos, std::string("cannot loop over a ") + type_name(seq));
          }
          scopes_.emplace_back();
          const auto count = static_cast<int64_t>(items.size());
          for (int64_t k = 0; k < count; ++k) {
            scopes_.back()[n.text] = items[static_cast<size_t>(k)];
            scopes_.back()["loop"] = Value::of_map({{"index", Value::integer(k + 1)},
                                                    {"index0", Value::integer(k)},
                                                    {"first", Value::boolean(k == 0)},
                                                    {"last", Value::boolean(k + 1 == count)},
                                                    {"length", Value::integer(count)}});
            run(n.body, out);
          }
          scopes_.pop_back();
          break;
        }
      }
    }
  }

 private:
  std::string text_of(const Value& v, size_t pos) const {
    switch (v.type) {
      case Value::Type::kUndefined:
        return "";
      case Value::Type::kNone:
        return "None";
      case Value::Type::kBool:
        return v.b ? "True" : "False";
      case Value::Type::kInt:
        return std::to_string(v.i);
      case Value::Type::kString:
        return v.s;
      default:
        src_.fail(pos, std::string("cannot print a ") + type_name(v) + " (use |tojson)");
    }
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value{};
  }

  static bool equal(const Value& a, const Value& b) {
    const bool an = a.type == Value::Type::kInt || a.type == Value::Type::kBool;
    const bool bn = b.type == Value::Type::kInt || b.type == Value::Type::kBool;
    if (an && bn) {
      return (a.type == Value::Type::kInt ? a.i : a.b) == (b.type == Value::Type::kInt ? b.i : b.b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
      case Value::Type::kString:
        return a.s == b.s;
      case Value::Type::kList:
        if (a.list->size() != b.list->size()) return false;
        for (size_t k = 0; k < a.list->size(); ++k) {
          if (!equal((*a.list)[k], (*b.list)[k])) return false;
        }
        return true;
      case Value::Type::kMap:
        return a.map == b.map;
      default:
        return true;  // none, undefined
    }
  }

  // Python's index into n items: negative counts from the end; nullopt out of range.
  static std::optional<size_t> index_into(int64_t i, size_t n) {
    if (i < 0) i += static_cast<int64_t>(n);
    if (i < 0 || i >= static_cast<int64_t>(n)) return std::nullopt;
    return static_cast<size_t>(i);
  }
  static size_t slice_bound(const Value& v, size_t n, size_t fallback) {
    if (v.type == Value::Type::kUndefined || v.type == Value::Type::kNone) return fallback;
    int64_t i = v.i;
    if (i < 0) i += static_cast<int64_t>(n);
    return static_cast<size_t>(std::clamp<int64_t>(i, 0, static_cast<int64_t>(n)));
  }

  Value eval(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.literal;
      case K::kName:
        return lookup(e.name);
      case K::kList: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::of_list(std::move(items));
      }
      case K::kAttr: {
        const Value base = eval(*e.args[0]);
        if (base.type == Value::Type::kMap) {
          return find_key(*base.map, e.name);
        }
        if (base.type == Value::Type::kUndefined || base.type == Value::Type::kNone) {
          src_.fail(e.pos, std::string("`.") + e.name + "` of a " + type_name(base) + " value");
        }
        return Value{};
      }
      case K::kIndex: {
        const Value base = eval(*e.args[0]);
        const Value key = eval(*e.args[1]);
        if (base.type == Value::Type::kMap && key.type == Value::Type::kString) {
          return find_key(*base.map, key.s);
        }
        if (base.type == Value::Type::kList && key.type == Value::Type::kInt) {
          const auto k = index_into(key.i, base.list->size());
          return k ? (*base.list)[*k] : Value{};
        }
        if (base.type == Value::Type::kString && key.type == Value::Type::kInt) {
          const auto chars = characters(base.s);
          const auto k = index_into(key.i, chars.size());
          return k ? Value::string(chars[*k]) : Value{};
        }
        src_.fail(e.pos,
                  std::string("cannot index a ") + type_name(base) + " with a " + type_name(key));
      }
      case K::kSlice: {
        const Value base = eval(*e.args[0]);
        const Value lo = e.args[1] ? eval(*e.args[1]) : Value{};
        const Value hi = e.args[2] ? eval(*e.args[2]) : Value{};
        for (const Value* b : {&lo, &hi}) {
          if (b->type != Value::Type::kInt && b->type != Value::Type::kUndefined &&
              b->type != Value::Type::kNone) {
            src_.fail(e.pos,
                      std::string("a slice bound must be an integer, not a ") + type_name(*b));
          }
        }
        if (base.type == Value::Type::kList) {
          const size_t n = base.list->size(), a = slice_bound(lo, n, 0), z = slice_bound(hi, n, n);
          return Value::of_list(a < z ? List(base.list->begin() + static_cast<long>(a),
                                             base.list->begin() + static_cast<long>(z))
                                      : List{});
        }
        if (base.type == Value::Type::kString) {
          const auto chars = characters(base.s);
          const size_t n = chars.size(), a = slice_bound(lo, n, 0), z = slice_bound(hi, n, n);
          std::string s;
          for (size_t k = a; k < z; ++k) s += chars[k];
          return Value::string(s);
        }
        src_.fail(e.pos, std::string("cannot slice a ") + type_name(base));
      }
      case K::kNot:
        return Value::boolean(!truthy(eval(*e.args[0])));
      case K::kNeg: {
        const Value v = eval(*e.args[0]);
        if (v.type != Value::Type::kInt) src_.fail(e.pos, std::string("`-` of a ") + type_name(v));
        return Value::integer(-v.i);
      }
      case K::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case K::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case K::kCond:
        return truthy(eval(*e.args[1])) ? eval(*e.args[0]) : eval(*e.args[2]);
      case K::kBinary:
        return binary(e, eval(*e.args[0]), eval(*e.args[1]));
      case K::kCompare: {
        const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
        if (e.name == "==") return Value::boolean(equal(a, b));
        if (e.name == "!=") return Value::boolean(!equal(a, b));
        int c = 0;
        if (a.type == Value::Type::kInt && b.type == Value::Type::kInt) {
          c = a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
        } else if (a.type == Value::Type::kString && b.type == Value::Type::kString) {
          c = a.s.compare(b.s);
        } else {
          src_.fail(e.pos, "cannot compare a " + std::string(type_name(a)) + " and a " +
                               type_name(b) + " with `" + e.name + "`");
        }
        const bool r = e.name == "<"    ? c < 0
                       : e.name == ">"  ? c > 0
                       : e.name == "<=" ? c <= 0
                                        : c >= 0;
        return Value::boolean(r);
      }
      case K::kIn: {
        const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
        bool r = false;
        if (b.type == Value::Type::kString && a.type == Value::Type::kString) {
          r = b.s.find(a.s) != std::string::npos;
        } else if (b.type == Value::Type::kList) {
          r = std::any_of(b.list->begin(), b.list->end(),
                          [&](const Value& x) { return equal(a, x); });
        } else if (b.type == Value::Type::kMap && a.type == Value::Type::kString) {
          r = find_key(*b.map, a.s).type != Value::Type::kUndefined;
        } else {
          src_.fail(e.pos, std::string("`in` of a ") + type_name(a) + " and a " + type_name(b));
        }
        return Value::boolean(r != e.negate);
      }
      case K::kTest: {
        const Value v = eval(*e.args[0]);
        bool r = false;
        if (e.name == "defined") r = v.type != Value::Type::kUndefined;
        if (e.name == "undefined") r = v.type == Value::Type::kUndefined;
        if (e.name == "none") r = v.type == Value::Type::kNone;
        if (e.name == "string") r = v.type == Value::Type::kString;
        return Value::boolean(r != e.negate);
      }
      case K::kFilter:
        return filter(e, eval(*e.args[0]));
      case K::kMethod: {
        const Value self = eval(*e.args[0]);
        if (self.type != Value::Type::kString) {
          src_.fail(e.pos, "`." + e.name + "()` of a " + type_name(self) + " (strings only)");
        }
        if (e.name == "strip") return Value::string(strip(self.s, true, true));
        if (e.name == "lstrip") return Value::string(strip(self.s, true, false));
        if (e.name == "rstrip") return Value::string(strip(self.s, false, true));
        if (e.name == "upper" || e.name == "lower") return filter(e, self);
        const Value arg = eval(*e.args[1]);
        if (arg.type != Value::Type::kString) {
          src_.fail(e.pos, "`." + e.name + "()` needs a string argument, not a " + type_name(arg));
        }
        const std::string& s = self.s;
        if (e.name == "startswith") return Value::boolean(s.rfind(arg.s, 0) == 0);
        return Value::boolean(s.size() >= arg.s.size() &&
                              s.compare(s.size() - arg.s.size(), arg.s.size(), arg.s) == 0);
      }
      case K::kRaise: {
        const Value message = eval(*e.args[0]);
        throw DataError(text_of(message, e.pos));
      }
    }
    src_.fail(e.pos, "cannot evaluate this expression");
  }

  Value binary(const Expr& e, const Value& a, const Value& b) const {
    if (e.name == "~") return Value::string(text_of(a, e.pos) + text_of(b, e.pos));
    using T = Value::Type;
    if (e.name == "+") {
      if (a.type == T::kString && b.type == T::kString) return Value::string(a.s + b.s);
      if (a.type == T::kList && b.type == T::kList) {
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::of_list(std::move(items));
      }
    }
    if (a.type == T::kInt && b.type == T::kInt) {
      if (e.name == "+") return Value::integer(a.i + b.i);
      if (e.name == "-") return Value::integer(a.i - b.i);
      if (e.name == "*") return Value::integer(a.i * b.i);
      if (b.i == 0) src_.fail(e.pos, "`" + e.name + "` by zero");
      // Python's floor division and modulo.
      int64_t q = a.i / b.i, r = a.i % b.i;
      if (r != 0 && ((r < 0) != (b.i < 0))) {
        --q;
        r += b.i;
      }
      return Value::integer(e.name == "//" ? q : r);
    }
    src_.fail(e.pos, "`" + e.name + "` of a " + type_name(a) + " and a " + type_name(b));
  }

  Value filter(const Expr& e, const Value& v) const {
    if (e.name == "tojson") {
      std::string out;
      to_json(v, out);
      return Value::string(out);
    }
    if (e.name == "string") return Value::string(text_of(v, e.pos));
    if (e.name == "length") {
      if (v.type == Value::Type::kString) {
        return Value::integer(static_cast<int64_t>(characters(v.s).size()));
      }
      if (v.type == Value::Type::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
      if (v.type == Value::Type::kMap) return Value::integer(static_cast<int64_t>(v.map->size()));
      src_.fail(e.pos, std::string("`length` of a ") + type_name(v));
    }
    if (v.type != Value::Type::kString) {
      src_.fail(e.pos, "`" + e.name + "` of a " + type_name(v) + " (strings only)");
    }
    if (e.name == "trim") return Value::string(strip(v.s, true, true));
    std::string s = v.s;  // upper, lower: ASCII letters
    for (char& c : s) {
      if (e.name == "upper" && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
      if (e.name == "lower" && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return Value::string(s);
  }

  const Source& src_;
  std::vector<Scope> scopes_;
};

}  // namespace

struct ChatTemplate::Impl {
  Source source;
  std::vector<Node> nodes;
};

ChatTemplate::ChatTemplate(const std::string& source, std::string origin) {
  auto impl = std::make_shared<Impl>();
  impl->source.origin = std::move(origin);
  impl->source.text = source;
  // keep_trailing_newline=False: one newline at the end of the source is dropped.
  std::string text = source;
  if (!text.empty() && text.back() == '\n') {
    text.pop_back();
    if (!text.empty() && text.back() == '\r') text.pop_back();
  }
  Source trimmed{text, impl->source.origin};
  impl->nodes = Parser(trimmed, lex(trimmed)).parse();
  impl->source.text = text;
  impl_ = std::move(impl);
}

const std::string& ChatTemplate::origin() const { return impl_->source.origin; }

std::string ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  List messages;
  for (const ChatMessage& m : inputs.messages) {
    messages.push_back(
        Value::of_map({{"role", Value::string(m.role)}, {"content", Value::string(m.content)}}));
  }
  Scope globals{{"messages", Value::of_list(std::move(messages))},
                {"bos_token", Value::string(inputs.bos_token)},
                {"eos_token", Value::string(inputs.eos_token)},
                {"add_generation_prompt", Value::boolean(inputs.add_generation_prompt)}};
  std::vector<Scope> scopes;
  scopes.push_back(std::move(globals));
  scopes.emplace_back();  // the template's own `set`s
  std::string out;
  Renderer(impl_->source, std::move(scopes)).run(impl_->nodes, out);
  return out;
}

std::string read_chat_template_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("chat template " + path + ": cannot be read (missing or unreadable)");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw DataError("chat template " + path + ": cannot be read");
  return text.str();
}

std::optional<ChatTemplateSource> find_chat_template(const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  const fs::path given(tokenizer_path);
  std::string dir =
      (fs::is_directory(given) ? given : given.parent_path()).lexically_normal().string();
  if (dir.empty()) dir = ".";
  ChatTemplateSource found;
  bool have = false;
  const std::string config_path = dir + "/tokenizer_config.json";
  std::ifstream in(config_path);
  if (in) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw DataError("tokenizer config " + config_path + " is not valid JSON: " + e.what());
    }
    auto token = [&](const char* key) -> std::string {
      const auto it = config.find(key);
      if (it == config.end()) return "";
      if (it->is_string()) return it->get<std::string>();
      if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        return (*it)["content"].get<std::string>();
      }
      return "";
    };
    found.bos_token = token("bos_token");
    found.eos_token = token("eos_token");
    const auto it = config.find("chat_template");
    if (it != config.end() && !it->is_null()) {
      if (!it->is_string()) {
        throw DataError(config_path +
                        ": chat_template must be a string (a list of named templates is not "
                        "supported; give one with inference.chat_template = PATH)");
      }
      found.source = it->get<std::string>();
      found.origin = config_path + " (chat_template)";
      have = true;
    }
  }
  if (!have) {
    const std::string jinja = dir + "/chat_template.jinja";
    std::ifstream probe(jinja);
    if (!probe) return std::nullopt;
    found.source = read_chat_template_file(jinja);
    found.origin = jinja;
  }
  return found;
}

}  // namespace kolos::tokenizer
