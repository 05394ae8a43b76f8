// Lexing of chat templates (chat_template_detail.h): lex() cuts the source
// into text and tags, with Jinja's whitespace rules applied to the text
// (`-` on a tag strips the whitespace beside it; transformers renders with
// trim_blocks, which drops the first newline after a block tag, and
// lstrip_blocks, which drops the spaces and tabs before a block tag on its
// line); tokenize() cuts the inside of a tag into names, integers, string
// literals and operators.
#include "chat_template_detail.h"

#include <cctype>
#include <exception>
#include <string>

namespace kolos::tokenizer::jinja {

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

}  // namespace kolos::tokenizer::jinja
