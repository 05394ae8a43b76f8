// The Jinja2 subset of chat templates (kolos/tokenizer/chat_template.h):
// ChatTemplate, and finding and reading a tokenizer's template.
//
// Three passes: the source is cut into text and tags, with Jinja's
// whitespace rules applied to the text (`-` on a tag strips the
// whitespace beside it; transformers renders with trim_blocks, which drops
// the first newline after a block tag, and lstrip_blocks, which drops the
// spaces and tabs before a block tag on its line; one trailing newline of
// the source is dropped); the tags are parsed into a tree of statements
// and expressions, refusing what the subset lacks; render() walks the tree.
// The passes are chat_template_lex.cpp, chat_template_parse.cpp and
// chat_template_render.cpp, their shared types chat_template_detail.h.
#include "kolos/tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_template_detail.h"
#include "kolos/core/error.h"

namespace kolos::tokenizer {

struct ChatTemplate::Impl {
  jinja::Source source;
  std::vector<jinja::Node> nodes;
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
  jinja::Source trimmed{text, impl->source.origin};
  impl->nodes = jinja::parse(trimmed, jinja::lex(trimmed));
  impl->source.text = text;
  impl_ = std::move(impl);
}

const std::string& ChatTemplate::origin() const { return impl_->source.origin; }

std::string ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  using jinja::Value;
  jinja::List messages;
  for (const ChatMessage& m : inputs.messages) {
    messages.push_back(
        Value::of_map({{"role", Value::string(m.role)}, {"content", Value::string(m.content)}}));
  }
  jinja::Scope globals{{"messages", Value::of_list(std::move(messages))},
                       {"bos_token", Value::string(inputs.bos_token)},
                       {"eos_token", Value::string(inputs.eos_token)},
                       {"add_generation_prompt", Value::boolean(inputs.add_generation_prompt)}};
  std::vector<jinja::Scope> scopes;
  scopes.push_back(std::move(globals));
  scopes.emplace_back();  // the template's own `set`s
  std::string out;
  jinja::render(impl_->source, std::move(scopes), impl_->nodes, out);
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
