// Chat templates: the Jinja2 template a Hugging Face tokenizer_config.json
// carries as "chat_template", which turns a conversation into the prompt
// text the model was trained on. kolos interprets a subset of Jinja2, the
// subset chat templates use (docs/tokenizers.md, "Chat templates"):
//
//   {{ expr }}, {% for x in xs %} with loop.index, index0, first, last,
//   length; {% if %} {% elif %} {% else %}; {% set name = expr %};
//   {# comments #}; whitespace control {%- -%} {{- -}} and the settings
//   transformers renders with (trim_blocks, lstrip_blocks, no trailing
//   newline); string, integer, boolean, none and list literals;
//   + - * // % ~, == != < <= > >=, and or not, in / not in,
//   `x if c else y`, `is [not] defined/undefined/none/string`; attribute
//   and subscript access (message.role, message['role'], xs[-1], xs[1:]);
//   the filters trim, length, upper, lower, string, tojson; the methods
//   strip, lstrip, rstrip, upper, lower, startswith, endswith; the
//   function raise_exception(message).
//
// Anything else (a macro, a dict literal, an unknown filter, `namespace`,
// ...) is refused when the template is parsed, with an error naming the
// construct and its line and column; a template is never rendered in part.
//
// Thread safety: a ChatTemplate is immutable once parsed; render() may be
// called from several threads at once. Torch-free.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kolos::tokenizer {

struct ChatMessage {
  std::string role;
  std::string content;
};

// The variables a chat template sees: `messages` (a list of {role,
// content}), `bos_token`, `eos_token`, `add_generation_prompt`.
struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  std::string bos_token;
  std::string eos_token;
  bool add_generation_prompt = true;
};

class ChatTemplate {
 public:
  // Parses `source`. `origin` names it in errors (a file path). Throws
  // kolos::DataError "ORIGIN:LINE:COL: ..." naming a construct outside the
  // subset or a syntax error.
  ChatTemplate(const std::string& source, std::string origin);

  // The prompt text. Throws kolos::DataError: with exactly the template's
  // message when it calls raise_exception(message); "ORIGIN:LINE:COL: ..."
  // for an error while rendering (an attribute of an undefined value, `+`
  // of a string and a number, ...).
  std::string render(const ChatTemplateInputs& inputs) const;

  const std::string& origin() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// A chat template and the special token strings it is rendered with.
struct ChatTemplateSource {
  std::string source;
  std::string origin;  // the file it came from
  std::string bos_token, eos_token;
};

// The chat template of the tokenizer file or directory `tokenizer_path`:
// "chat_template" of the tokenizer_config.json next to it (a string), else a
// chat_template.jinja next to it (as recent transformers save it); bos_token
// and eos_token from that tokenizer_config.json when it has them. nullopt
// when there is none. Throws kolos::DataError when tokenizer_config.json is
// not valid JSON or its chat_template is not a string.
std::optional<ChatTemplateSource> find_chat_template(const std::string& tokenizer_path);

// Reads a template file; throws kolos::DataError naming `path` when it is
// missing or unreadable.
std::string read_chat_template_file(const std::string& path);

}  // namespace kolos::tokenizer
