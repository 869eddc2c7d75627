// Tokenizer::Load / FromJson: parses tokenizer.json and tokenizer_config.json into the tables the
// pipeline runs on, turning every problem into a one-line Status that names file and field.
#include <fstream>
#include <sstream>
#include <utility>

#include "text/tokenizer/json_fields.h"
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_tables.h"
#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// Deeper documents are rejected before anything walks them recursively; real files stay below
// ten levels.
constexpr size_t kMaxJsonDepth = 128;

// Makes an error message one printable line even when it quotes bytes of a broken file.
std::string OneLine(std::string_view s) {
  std::string out = SanitizeUtf8(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  return out;
}

Expected<Json> ParseJson(std::string_view text) {
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; the rest says where and why.
    if (const size_t close = what.find("] "); what.starts_with("[json.") && close != what.npos) {
      what = what.substr(close + 2);
    }
    return Status::Error("bad JSON: " + OneLine(what));
  }
  std::vector<std::pair<const Json*, size_t>> stack = {{&j, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    if (depth > kMaxJsonDepth) {
      return Status::Error("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    if (node->is_structured()) {
      for (const Json& child : *node) stack.emplace_back(&child, depth + 1);
    }
  }
  return j;
}

Expected<std::vector<AddedToken>> ParseAddedTokens(const Json& root) {
  std::vector<AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) return FieldError("added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return FieldError(path, "expected an object");
    AddedToken token;
    const auto id = t.find("id");
    if (id == t.end() || !id->is_number_unsigned() || id->get<uint64_t>() > 0x7FFFFFFF) {
      return FieldError(JoinPath(path, "id"), "expected an integer in [0, 2^31)");
    }
    token.id = static_cast<int32_t>(id->get<uint64_t>());
    MT_ASSIGN_OR_RETURN(token.content, RequiredString(t, "content", path));
    if (!IsValidUtf8(token.content)) {
      return FieldError(JoinPath(path, "content"), "is not valid UTF-8");
    }
    MT_ASSIGN_OR_RETURN(token.special, OptionalBool(t, "special", path, false));
    MT_ASSIGN_OR_RETURN(token.single_word, OptionalBool(t, "single_word", path, false));
    MT_ASSIGN_OR_RETURN(token.lstrip, OptionalBool(t, "lstrip", path, false));
    MT_ASSIGN_OR_RETURN(token.rstrip, OptionalBool(t, "rstrip", path, false));
    MT_ASSIGN_OR_RETURN(token.normalized, OptionalBool(t, "normalized", path, !token.special));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// transformers re-applies tokenizer_config.json's "added_tokens_decoder" on top of the
// tokenizer.json tokens (its flags win) and registers named special tokens that are in the
// vocabulary but not yet added, as special and not normalized.
Status MergeConfigTokens(const Json& config, const BpeModel& model,
                         std::vector<AddedToken>& tokens) {
  auto find = [&tokens](std::string_view content) -> AddedToken* {
    for (AddedToken& t : tokens) {
      if (t.content == content) return &t;
    }
    return nullptr;
  };
  if (const auto dec = config.find("added_tokens_decoder");
      dec != config.end() && dec->is_object()) {
    for (const auto& [key, t] : dec->items()) {
      const std::string path = "added_tokens_decoder." + key;
      if (!t.is_object()) return FieldError(path, "expected an object");
      AddedToken token;
      MT_ASSIGN_OR_RETURN(token.content, RequiredString(t, "content", path));
      if (!IsValidUtf8(token.content) || token.content.empty()) continue;
      MT_ASSIGN_OR_RETURN(token.special, OptionalBool(t, "special", path, false));
      MT_ASSIGN_OR_RETURN(token.single_word, OptionalBool(t, "single_word", path, false));
      MT_ASSIGN_OR_RETURN(token.lstrip, OptionalBool(t, "lstrip", path, false));
      MT_ASSIGN_OR_RETURN(token.rstrip, OptionalBool(t, "rstrip", path, false));
      MT_ASSIGN_OR_RETURN(token.normalized, OptionalBool(t, "normalized", path, !token.special));
      if (AddedToken* existing = find(token.content)) {
        token.id = existing->id;
        token.special = token.special || existing->special;
        *existing = std::move(token);
        continue;
      }
      if (const auto id = model.TokenToId(token.content)) {
        token.id = *id;
      } else {
        char* end = nullptr;
        const long long parsed = std::strtoll(key.c_str(), &end, 10);
        if (end == key.c_str() || *end != '\0' || parsed < 0 || parsed > 0x7FFFFFFF) {
          return FieldError(path, "expected a token id as the key");
        }
        token.id = static_cast<int32_t>(parsed);
      }
      tokens.push_back(std::move(token));
    }
  }
  std::vector<std::string> named;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                          "cls_token", "mask_token"}) {
    const auto it = config.find(key);
    if (it == config.end()) continue;
    if (it->is_string()) named.push_back(it->get<std::string>());
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      named.push_back((*it)["content"].get<std::string>());
    }
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    const auto it = config.find(key);
    if (it == config.end() || !it->is_array()) continue;
    for (const Json& t : *it) {
      if (t.is_string()) named.push_back(t.get<std::string>());
      if (t.is_object() && t.contains("content") && t["content"].is_string()) {
        named.push_back(t["content"].get<std::string>());
      }
    }
  }
  for (const std::string& content : named) {
    if (content.empty() || find(content) != nullptr) continue;
    // A named token outside the vocabulary would get a fresh id past the model's embedding
    // rows in transformers; such a token cannot be fed to the model, so it is left out.
    const auto id = model.TokenToId(content);
    if (!id) continue;
    tokens.push_back(AddedToken{*id, content, true, false, false, false, false});
  }
  return OkStatus();
}

Status BuildTables(const Json& root, TokenizerTables& t) {
  if (!root.is_object()) return FieldError("", "expected a JSON object at the top level");
  const auto model = root.find("model");
  if (model == root.end() || model->is_null()) return FieldError("model", "missing");
  if (!model->is_object()) return FieldError("model", "expected an object");
  std::string type = "BPE";
  if (const auto it = model->find("type"); it != model->end()) {
    if (!it->is_string()) return FieldError("model.type", "expected a string");
    type = it->get<std::string>();
  } else if (!model->contains("merges")) {
    return FieldError("model.type", "missing (and the model has no merges, so it is not BPE)");
  }
  if (type != "BPE") {
    return FieldError("model.type", "unsupported model type \"" + type + "\" (supported: BPE)");
  }
  MT_ASSIGN_OR_RETURN(t.model, BpeModel::FromJson(*model, "model"));
  // An empty vocabulary parses, but leaves the model nothing to split text into: every text
  // would encode to no tokens at all, without an error anywhere.
  if (t.model.id_limit() == 0) {
    return FieldError("model.vocab", "is empty; a tokenizer needs at least one token");
  }
  const Json null_json;
  auto section = [&](const char* key) -> const Json& {
    const auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  MT_ASSIGN_OR_RETURN(t.normalizer, Normalizer::FromJson(section("normalizer"), "normalizer"));
  const Json& pre = section("pre_tokenizer");
  MT_ASSIGN_OR_RETURN(t.pre_tokenizer, PreTokenizer::FromJson(pre, "pre_tokenizer"));
  const Json& post = section("post_processor");
  MT_ASSIGN_OR_RETURN(t.post_processor, PostProcessor::FromJson(post, "post_processor"));
  MT_ASSIGN_OR_RETURN(t.decoder, Decoder::FromJson(section("decoder"), "decoder"));
  MT_ASSIGN_OR_RETURN(t.added_tokens, ParseAddedTokens(root));
  return OkStatus();
}

// Finishes the tables once the config is known: config tokens, matchers, ids, post-processor.
void FinishTables(TokenizerTables& t) {
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  int64_t limit = t.model.id_limit();
  for (size_t i = 0; i < t.added_tokens.size(); ++i) {
    const AddedToken& token = t.added_tokens[i];
    t.added_by_id[token.id] = i;
    t.added_by_content[token.content] = token.id;
    limit = std::max<int64_t>(limit, int64_t{token.id} + 1);
    if (token.normalized) {
      normalized.push_back(token);
      normalized_patterns.push_back(t.normalizer.Apply(token.content));
    } else {
      raw.push_back(token);
      raw_patterns.push_back(token.content);
    }
  }
  t.vocab_size = static_cast<int32_t>(limit);
  t.raw_matcher = AddedTokenMatcher(std::move(raw), std::move(raw_patterns));
  t.normalized_matcher = AddedTokenMatcher(std::move(normalized), std::move(normalized_patterns));

  auto id_of = [&t](const std::string& s) -> std::optional<int32_t> {
    if (s.empty()) return std::nullopt;
    if (const auto it = t.added_by_content.find(s); it != t.added_by_content.end()) {
      return it->second;
    }
    return t.model.TokenToId(s);
  };
  TokenizerConfig& c = t.config;
  c.bos_token_id = id_of(c.bos_token);
  c.eos_token_id = id_of(c.eos_token);
  c.unk_token_id = id_of(c.unk_token);
  c.pad_token_id = id_of(c.pad_token);
  if (c.add_bos_eos_given) {
    // transformers drops add_bos_token when there is no bos token, and likewise for eos.
    std::vector<int32_t> bos, eos;
    if (c.add_bos_token && c.bos_token_id) bos.push_back(*c.bos_token_id);
    if (c.add_eos_token && c.eos_token_id) eos.push_back(*c.eos_token_id);
    t.post_processor = PostProcessor::BosEos(std::move(bos), std::move(eos));
  }
}

std::string SiblingName(const std::string& name, std::string_view sibling) {
  constexpr std::string_view kMain = "tokenizer.json";
  if (name.ends_with(kMain))
    return name.substr(0, name.size() - kMain.size()) + std::string(sibling);
  return name + " (" + std::string(sibling) + ")";
}

Expected<std::shared_ptr<const TokenizerTables>> BuildFromTexts(
    std::string_view tokenizer_json, const std::string& tokenizer_name,
    std::string_view config_json, const std::string& config_name,
    const std::string& chat_template_jinja) {
  auto tables = std::make_shared<TokenizerTables>();
  try {
    auto root = ParseJson(tokenizer_json);
    if (!root.ok()) return root.status().WithContext(tokenizer_name);
    MT_RETURN_IF_ERROR(BuildTables(*root, *tables).WithContext(tokenizer_name));
    if (!config_json.empty()) {
      auto config = ParseJson(config_json);
      if (!config.ok()) return config.status().WithContext(config_name);
      auto parsed = ParseTokenizerConfig(*config);
      if (!parsed.ok()) return parsed.status().WithContext(config_name);
      tables->config = std::move(parsed).value();
      MT_RETURN_IF_ERROR(
          MergeConfigTokens(*config, tables->model, tables->added_tokens).WithContext(config_name));
    }
    if (tables->config.chat_template.empty() && !chat_template_jinja.empty()) {
      tables->config.chat_template = chat_template_jinja;
      tables->config.chat_template_json = Json(SanitizeUtf8(chat_template_jinja)).dump();
    }
    FinishTables(*tables);
  } catch (const std::exception& e) {
    // The readers above check every field they touch; this only catches what they missed
    // (or std::bad_alloc), so a broken file still never takes the process down.
    return Status::Error(tokenizer_name + ": cannot read the tokenizer: " + OneLine(e.what()));
  }
  return std::shared_ptr<const TokenizerTables>(std::move(tables));
}

Expected<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(path.string() + ": cannot open for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return Status::Error(path.string() + ": read failed");
  return buffer.str();
}

}  // namespace

Expected<Tokenizer> Tokenizer::FromJson(std::string_view tokenizer_json,
                                        std::string_view tokenizer_config_json,
                                        const std::string& name_for_errors) {
  const std::string config_name = SiblingName(name_for_errors, "tokenizer_config.json");
  auto tables =
      BuildFromTexts(tokenizer_json, name_for_errors, tokenizer_config_json, config_name, "");
  if (!tables.ok()) return tables.status();
  return Tokenizer(std::move(tables).value());
}

Expected<Tokenizer> Tokenizer::Load(const std::filesystem::path& model_dir) {
  const std::filesystem::path tokenizer_path = model_dir / "tokenizer.json";
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  const std::filesystem::path jinja_path = model_dir / "chat_template.jinja";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(tokenizer_path, ec)) {
    return Status::Error(tokenizer_path.string() +
                         ": not found (a Hugging Face model directory has one; only "
                         "tokenizer.json tokenizers are supported)");
  }
  MT_ASSIGN_OR_RETURN(const std::string tokenizer_json, ReadFile(tokenizer_path));
  std::string config_json;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    MT_ASSIGN_OR_RETURN(config_json, ReadFile(config_path));
  }
  std::string jinja;
  if (std::filesystem::is_regular_file(jinja_path, ec)) {
    MT_ASSIGN_OR_RETURN(jinja, ReadFile(jinja_path));
  }
  auto tables = BuildFromTexts(tokenizer_json, tokenizer_path.string(), config_json,
                               config_path.string(), jinja);
  if (!tables.ok()) return tables.status();
  return Tokenizer(std::move(tables).value());
}

}  // namespace moetier::text
