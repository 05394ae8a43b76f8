// Rendering of chat templates (chat_template_detail.h): the tree parse()
// built is walked against the template's variables, statements writing
// text and expressions evaluated as Jinja2 does (Python's operators,
// comparisons and indexing; the filters, tests and string methods of the
// subset; raise_exception()).
#include "chat_template_detail.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "kolos/core/error.h"

namespace kolos::tokenizer::jinja {
namespace {

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

void render(const Source& src, std::vector<Scope> scopes, const std::vector<Node>& nodes,
            std::string& out) {
  Renderer(src, std::move(scopes)).run(nodes, out);
}

}  // namespace kolos::tokenizer::jinja
