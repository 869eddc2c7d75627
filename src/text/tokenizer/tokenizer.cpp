// The encode and decode pipelines, in Hugging Face's order: added tokens in the raw text ->
// normalizer -> added tokens in the normalized text -> pre-tokenizer -> BPE per word ->
// post-processor; and ids -> vocabulary strings -> decoder.
#include "text/tokenizer/tokenizer.h"

#include "text/tokenizer/tokenizer_tables.h"
#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// Runs the pre-tokenizer and the model on normalized text that holds no added token.
void EncodeWords(const TokenizerTables& t, std::string_view text, bool at_origin,
                 std::vector<int32_t>& ids) {
  if (text.empty()) return;
  PieceList words;
  words.text.assign(text);
  words.pieces.push_back({0, static_cast<uint32_t>(text.size()), at_origin});
  // A final ByteLevel step is left to the model, which spells only the words it has not seen.
  const ByteLevelAlphabet* spell = t.pre_tokenizer.final_byte_level();
  t.pre_tokenizer.Apply(words, /*defer_byte_spelling=*/spell != nullptr);
  for (const PieceList::Piece& piece : words.pieces) {
    t.model.Tokenize(words.View(piece), spell, ids);
  }
}

// Normalizes one stretch of raw text between added tokens and encodes it.
void EncodeSection(const TokenizerTables& t, std::string_view section, bool at_origin,
                   std::vector<int32_t>& ids) {
  std::string normalized_storage;
  std::string_view normalized = section;
  if (!t.normalizer.empty()) {
    normalized_storage = t.normalizer.Apply(section);
    normalized = normalized_storage;
  }
  if (t.normalized_matcher.empty()) {
    EncodeWords(t, normalized, at_origin, ids);
    return;
  }
  t.normalized_matcher.Split(
      normalized,
      [&](size_t begin, size_t end) {
        EncodeWords(t, normalized.substr(begin, end - begin), at_origin && begin == 0, ids);
      },
      [&ids](int32_t id) { ids.push_back(id); });
}

// transformers' clean_up_tokenization, applied when the config asks for it.
std::string CleanUpTokenization(std::string s) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    size_t pos = 0;
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, pos)) {
      out.append(s, pos, at - pos);
      out.append(to);
      pos = at + from.size();
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
  }
  return s;
}

}  // namespace

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerTables& t = *tables_;
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = SanitizeUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  t.raw_matcher.Split(
      text,
      [&](size_t begin, size_t end) {
        EncodeSection(t, text.substr(begin, end - begin), begin == 0, ids);
      },
      [&ids](int32_t id) { ids.push_back(id); });
  if (add_special_tokens) ids = t.post_processor.Apply(std::move(ids));
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerTables& t = *tables_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* token = t.TokenString(id);
    if (token == nullptr) continue;
    if (skip_special_tokens && t.IsSpecial(id)) continue;
    tokens.push_back(*token);
  }
  std::string text = t.decoder.Decode(std::move(tokens));
  if (t.config.clean_up_tokenization_spaces) text = CleanUpTokenization(std::move(text));
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return tables_->vocab_size;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const auto it = tables_->added_by_content.find(token);
      it != tables_->added_by_content.end()) {
    return it->second;
  }
  return tables_->model.TokenToId(token);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  const std::string* token = tables_->TokenString(id);
  return token == nullptr ? std::string() : *token;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return tables_->IsSpecial(id);
}

const TokenizerConfig& Tokenizer::config() const {
  return tables_->config;
}

}  // namespace moetier::text
