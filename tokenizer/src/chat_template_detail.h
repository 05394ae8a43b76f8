// The internals of the chat-template engine (kolos/tokenizer/chat_template.h)
// that its sources share: the values a template computes with, the tree it
// is parsed into, the source text (which positions in errors refer to),
// and the entry points of the passes:
//
//   chat_template_lex.cpp     the source to text and tags; a tag's inside to tokens
//   chat_template_parse.cpp   tags to the tree of statements and expressions
//   chat_template_render.cpp  the tree evaluated and rendered to text
//   chat_template_value.cpp   the helpers on values and strings declared here
//   chat_template.cpp         ChatTemplate, and finding a tokenizer's template
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolos/core/error.h"

namespace kolos::tokenizer::jinja {

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

const char* type_name(const Value& v);
// The value of `key` in `map`; undefined when it has none.
Value find_key(const Map& map, const std::string& key);
// Python's truth: false for undefined, none, false, 0 and empty strings,
// lists and mappings.
bool truthy(const Value& v);
// The UTF-8 characters of `s` (Python's str indexes and counts these).
std::vector<std::string> characters(const std::string& s);
// ASCII whitespace (space, \t \n \r \f \v).
bool is_space(char c);
// `s` without the ASCII whitespace at its left and/or right end.
std::string strip(const std::string& s, bool left, bool right);
// Python's json.dumps(x, ensure_ascii=False), which transformers' tojson is.
void to_json(const Value& v, std::string& out);

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

// The template text and its origin (a file path), for errors
// "ORIGIN:LINE:COL: ...".
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

// The source cut into text and tags, with Jinja's whitespace rules (and
// transformers' trim_blocks and lstrip_blocks) applied to the text;
// comments are dropped. Throws kolos::DataError for a tag never closed.
std::vector<Tag> lex(const Source& src);

// ---------------------------------------------------------------- tokens

struct Token {
  enum class Kind { kName, kInt, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int64_t number = 0;
  size_t pos;
};

// The tokens of a tag's inside `s`, which starts at offset `base` of the
// source; the last is a kEnd. Throws kolos::DataError for an unexpected
// character, a floating-point number, an integer too large, an escape
// outside the subset or a string literal never closed.
std::vector<Token> tokenize(const Source& src, const std::string& s, size_t base);

// ---------------------------------------------------------------- parsing

// The tree of `tags`. Throws kolos::DataError "ORIGIN:LINE:COL: ..." for a
// syntax error or a construct outside the subset.
std::vector<Node> parse(const Source& src, std::vector<Tag> tags);

// ---------------------------------------------------------------- rendering

// Renders `nodes` onto `out`. `scopes`: the variables, innermost last; a
// `set` assigns in the innermost, a loop adds one for its body. Throws
// kolos::DataError for an error while rendering and for raise_exception().
void render(const Source& src, std::vector<Scope> scopes, const std::vector<Node>& nodes,
            std::string& out);

}  // namespace kolos::tokenizer::jinja
