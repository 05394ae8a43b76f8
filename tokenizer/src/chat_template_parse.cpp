// Parsing of chat templates (chat_template_detail.h): the tags lex() cut
// from the source become a tree of statements (text, output, for, if,
// set), and the expressions in them, tokenized, become expression trees
// by recursive descent (the conditional `x if c else y`; or, and, not;
// comparisons and `in`; `~`; + -; * // %; unary -; then attributes,
// subscripts, slices, filters, tests and method calls). What the subset
// lacks is refused while parsing, naming the construct and its position,
// so that no template is rendered in part.
#include "chat_template_detail.h"

#include <algorithm>
#include <iterator>
#include <memory>
#include <utility>

namespace kolos::tokenizer::jinja {
namespace {

// ---------------------------------------------------------------- expressions

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

}  // namespace

std::vector<Node> parse(const Source& src, std::vector<Tag> tags) {
  return Parser(src, std::move(tags)).parse();
}

}  // namespace kolos::tokenizer::jinja
