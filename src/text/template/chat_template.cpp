#include "text/template/chat_template.h"

#include <fstream>
#include <sstream>

namespace moetier::text {
namespace {

constexpr const char* kTemplateName = "chat template";
constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};

Expected<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path.string() + ": cannot open");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Status::Error(path.string() + ": read failed");
  return buf.str();
}

Expected<nlohmann::ordered_json> ReadJson(const std::filesystem::path& path) {
  MT_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error(path.string() + ": not valid JSON");
  if (!j.is_object()) return Status::Error(path.string() + ": expected a JSON object");
  return j;
}

// Copying a JSON document (as BuildContext does) recurses once per level: deep ones are refused
// before that.
Status CheckInputNesting(const nlohmann::ordered_json& j, const std::string& what) {
  Status nesting = jinja::CheckJsonNesting(j);
  return nesting.ok() ? nesting : Status::Error(what + " " + nesting.message());
}

}  // namespace

Expected<nlohmann::ordered_json> SpecialTokensFromConfig(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : kSpecialTokenKeys) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) {
      tokens[key] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens[key] = (*it)["content"];  // an AddedToken {"content": ..., "lstrip": ...}
    } else {
      return Status::Error(std::string("\"") + key +
                           "\" must be a string or an object with a string \"content\"");
    }
  }
  return tokens;
}

Expected<ChatTemplate> ChatTemplate::FromSource(std::string source,
                                                nlohmann::ordered_json special_tokens) {
  MT_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source, kTemplateName));
  ChatTemplate ct;
  ct.templates_.emplace_back("default", std::move(t));
  ct.source_ = std::move(source);
  if (special_tokens.is_object()) {
    for (const auto& [k, v] : special_tokens.items())
      if (!v.is_null()) ct.special_tokens_[k] = v;
  } else if (!special_tokens.is_null()) {
    return Status::Error("special tokens must be a JSON object");
  }
  return ct;
}

Expected<ChatTemplate> ChatTemplate::Load(const std::filesystem::path& model_dir) {
  const auto config_path = model_dir / "tokenizer_config.json";
  const auto jinja_path = model_dir / "chat_template.jinja";
  const auto processor_path = model_dir / "chat_template.json";
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) {
    return Status::Error(model_dir.string() + ": not a directory (expected a model directory)");
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  const bool has_config = std::filesystem::exists(config_path, ec);
  if (has_config) {
    MT_ASSIGN_OR_RETURN(config, ReadJson(config_path));
  }
  ChatTemplate ct;
  {
    auto tokens = SpecialTokensFromConfig(config);
    if (!tokens.ok()) return tokens.status().WithContext(config_path.string());
    ct.special_tokens_ = std::move(tokens).value();
  }
  auto add = [&](std::string name, const std::string& source,
                 const std::filesystem::path& origin) -> Status {
    auto t = jinja::Template::Parse(source, kTemplateName);
    if (!t.ok()) return t.status().WithContext(origin.string());
    ct.templates_.emplace_back(std::move(name), std::move(t).value());
    if (!ct.source_.empty()) ct.source_ += '\n';
    ct.source_ += source;
    return OkStatus();
  };
  // Newer checkpoints ship the template as its own file, which takes precedence (transformers).
  if (std::filesystem::exists(jinja_path, ec)) {
    MT_ASSIGN_OR_RETURN(std::string source, ReadFile(jinja_path));
    MT_RETURN_IF_ERROR(add("default", source, jinja_path));
    return ct;
  }
  auto field = config.find("chat_template");
  if (field != config.end() && !field->is_null()) {
    if (field->is_string()) {
      MT_RETURN_IF_ERROR(add("default", field->get<std::string>(), config_path));
      return ct;
    }
    if (!field->is_array()) {
      return Status::Error(config_path.string() +
                           ": \"chat_template\" must be a string or a list of {name, template}");
    }
    for (const auto& entry : *field) {
      if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
          !entry.contains("template") || !entry["template"].is_string()) {
        return Status::Error(
            config_path.string() +
            ": each \"chat_template\" entry needs string \"name\" and \"template\"");
      }
      MT_RETURN_IF_ERROR(
          add(entry["name"].get<std::string>(), entry["template"].get<std::string>(), config_path));
    }
    if (ct.templates_.empty()) {
      return Status::Error(config_path.string() + ": \"chat_template\" is an empty list");
    }
    return ct;
  }
  if (std::filesystem::exists(processor_path, ec)) {
    MT_ASSIGN_OR_RETURN(auto processor, ReadJson(processor_path));
    auto it = processor.find("chat_template");
    if (it != processor.end() && it->is_string()) {
      MT_RETURN_IF_ERROR(add("default", it->get<std::string>(), processor_path));
      return ct;
    }
  }
  return Status::Error(model_dir.string() +
                       ": no chat template (looked for chat_template.jinja and a \"chat_template\" "
                       "field in tokenizer_config.json)");
}

Expected<const jinja::Template*> ChatTemplate::Select(bool has_tools) const {
  if (templates_.size() == 1) return &templates_.front().second;
  auto find = [&](const char* name) -> const jinja::Template* {
    for (const auto& [n, t] : templates_)
      if (n == name) return &t;
    return nullptr;
  };
  if (has_tools) {
    if (const auto* t = find("tool_use")) return t;
  }
  if (const auto* t = find("default")) return t;
  return Status::Error("the checkpoint has several chat templates and none named \"default\"");
}

Expected<nlohmann::ordered_json> ChatTemplate::BuildContext(const ChatTemplateInputs& in) const {
  if (!in.messages.is_array()) return Status::Error("\"messages\" must be a JSON array");
  if (!in.tools.is_null() && !in.tools.is_array()) {
    return Status::Error("\"tools\" must be a JSON array or absent");
  }
  if (!in.extra.is_null() && !in.extra.is_object()) {
    return Status::Error("extra template variables must be a JSON object");
  }
  MT_RETURN_IF_ERROR(CheckInputNesting(in.messages, "\"messages\""));
  MT_RETURN_IF_ERROR(CheckInputNesting(in.tools, "\"tools\""));
  MT_RETURN_IF_ERROR(CheckInputNesting(in.extra, "extra template variables"));
  // transformers: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  // **special_tokens_map, **kwargs) — tools and documents are passed as None when absent.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  for (const auto& [k, v] : special_tokens_.items()) ctx[k] = v;
  if (in.extra.is_object()) {
    for (const auto& [k, v] : in.extra.items()) {
      if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt") {
        return Status::Error("extra template variable \"" + k + "\" clashes with a fixed one");
      }
      ctx[k] = v;
    }
  }
  return ctx;
}

Expected<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  return Render(inputs, jinja::RenderLimits{});
}

Expected<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs,
                                           const jinja::RenderLimits& limits) const {
  MT_ASSIGN_OR_RETURN(nlohmann::ordered_json ctx, BuildContext(inputs));
  MT_ASSIGN_OR_RETURN(const jinja::Template* t, Select(!inputs.tools.is_null()));
  jinja::RenderOptions options;
  options.limits = limits;
  options.now = inputs.now;
  return t->Render(ctx, options);
}

}  // namespace moetier::text
