// `kolos serve`'s chat template: which one the server uses (set-up), the
// special tokens that end an assistant's turn, and a request's `messages`
// checked and rendered with it.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>

#include "kolos/core/error.h"
#include "serve_server.h"

namespace kolos::cli::serve {

std::string Server::render_chat(const json& body) const {
  if (!chat) throw ApiError{400, chat_missing, "messages"};
  if (!body.contains("messages")) throw ApiError{400, "`messages` is required", "messages"};
  const json& messages = body["messages"];
  if (!messages.is_array()) {
    throw ApiError{400, "`messages` must be an array of {\"role\", \"content\"} objects",
                   "messages"};
  }
  if (messages.empty()) throw ApiError{400, "`messages` is empty", "messages"};
  tokenizer::ChatTemplateInputs inputs;
  inputs.bos_token = bos_token;
  inputs.eos_token = eos_token;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw ApiError{400, "`" + at + "` must be an object", at};
    if (!m.contains("role") || !m["role"].is_string()) {
      throw ApiError{400, "`" + at + ".role` must be a string", at + ".role"};
    }
    const std::string role = m["role"].get<std::string>();
    static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer"};
    if (std::find(std::begin(kRoles), std::end(kRoles), role) == std::end(kRoles)) {
      throw ApiError{400,
                     "`" + at + ".role` is `" + role +
                         "`; expected system, user, assistant, tool or developer",
                     at + ".role"};
    }
    if (!m.contains("content") || m["content"].is_null()) {
      throw ApiError{400, "`" + at + ".content` is required", at + ".content"};
    }
    std::string content;
    const json& c = m["content"];
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // content parts: text only
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          throw ApiError{400,
                         "`" + at + ".content` parts must be {\"type\": \"text\", \"text\": ...}",
                         at + ".content"};
        }
        content += part["text"].get<std::string>();
      }
    } else {
      throw ApiError{400, "`" + at + ".content` must be a string or an array of text parts",
                     at + ".content"};
    }
    if (tokenizer::to_valid_utf8(content) != content) {
      throw ApiError{400, "`" + at + ".content` is not valid UTF-8", at + ".content"};
    }
    inputs.messages.push_back({role, content});
  }
  if (body.contains("add_generation_prompt") && !body["add_generation_prompt"].is_null()) {
    if (!body["add_generation_prompt"].is_boolean()) {
      throw ApiError{400, "`add_generation_prompt` must be a boolean", "add_generation_prompt"};
    }
    inputs.add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  try {
    return chat->render(inputs);
  } catch (const Error& e) {  // raise_exception(...) or an error while rendering
    throw ApiError{400, e.what(), "messages"};
  }
}

void load_chat_template(Server& server, const inference::InferenceConfig& settings) {
  std::optional<tokenizer::ChatTemplateSource> found;
  if (server.tok) found = tokenizer::find_chat_template(server.tok->path());
  if (server.tok) {
    auto token = [&](std::optional<tokenizer::TokenId> id) {
      return id ? server.tok->id_to_token(*id).value_or("") : std::string();
    };
    server.bos_token =
        found && !found->bos_token.empty() ? found->bos_token : token(server.tok->bos_id());
    server.eos_token =
        found && !found->eos_token.empty() ? found->eos_token : token(server.tok->eos_id());
  }
  if (!settings.chat_template.empty()) {
    if (!server.tok) {
      throw ConfigError(
          "inference.chat_template: a chat template needs a tokenizer "
          "(--tokenizer PATH or inference.tokenizer)");
    }
    const std::string& path = settings.chat_template;
    server.chat.emplace(tokenizer::read_chat_template_file(path), path);
  } else if (!server.tok) {
    server.chat_missing =
        "this server has no chat template: it has no tokenizer (--tokenizer PATH) to find one "
        "with, and inference.chat_template is not set";
    return;
  } else if (!found) {
    server.chat_missing =
        "this server has no chat template: no tokenizer_config.json with a "
        "\"chat_template\" (or chat_template.jinja) next to " +
        server.tok->path() + "; give one with --chat-template PATH";
    return;
  } else {
    try {
      server.chat.emplace(found->source, found->origin);
    } catch (const Error& e) {
      server.chat_missing = std::string("this server's chat template is not supported: ") +
                            e.what() + "; give another with --chat-template PATH";
      std::fprintf(stderr, "kolos: warning: /v1/chat/completions is off: %s\n",
                   server.chat_missing.c_str());
      return;
    }
  }
  // The text after an assistant message's content, up to the next turn.
  const std::string marker = "kolos-turn-probe";
  tokenizer::ChatTemplateInputs probe;
  probe.messages = {{"user", "hi"}, {"assistant", marker}};
  probe.bos_token = server.bos_token;
  probe.eos_token = server.eos_token;
  probe.add_generation_prompt = false;
  try {
    const std::string text = server.chat->render(probe);
    const size_t at = text.rfind(marker);
    if (at == std::string::npos) return;
    const auto ids = server.tok->encode(text.substr(at + marker.size()), false);
    // The first token after the content, when it is a special token.
    if (!ids.empty() && server.tok->decode({ids[0]}, true).empty()) {
      server.turn_end_ids.push_back(ids[0]);
    }
  } catch (const Error&) {
    // A template that refuses the probe conversation: no turn-end ids beyond eos.
  }
}

}  // namespace kolos::cli::serve
