// A Hugging Face tokenizer loaded from tokenizer.json (+ tokenizer_config.json), without Python.
// Encode must equal Hugging Face's ids token for token; see README.md beside this file for what
// is supported and the few known differences.
//
// Contract: a Tokenizer is immutable after loading; its const methods may run concurrently on
// many threads. Copies are cheap and share the loaded tables.
//
// Invalid UTF-8 given to Encode does not fail: each maximal ill-formed byte sequence is replaced
// by U+FFFD first, which is what Hugging Face sees when a Rust caller converts the bytes with
// String::from_utf8_lossy (or Python decodes them with errors="replace").
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/tokenizer_config.h"

namespace moetier::text {

struct TokenizerTables;

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and, when present, model_dir/tokenizer_config.json (and
  // model_dir/chat_template.jinja). Errors name the file and the field.
  static Expected<Tokenizer> Load(const std::filesystem::path& model_dir);

  // As Load, from the texts of the files; `tokenizer_config_json` may be empty.
  // `name_for_errors` prefixes every error message (e.g. the path of tokenizer.json).
  static Expected<Tokenizer> FromJson(std::string_view tokenizer_json,
                                      std::string_view tokenizer_config_json,
                                      const std::string& name_for_errors);

  // The ids of `text`. With add_special_tokens, the post-processor's tokens (e.g. BOS) are
  // added around them, as transformers' tokenizer(text) does.
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;

  // The text of `ids`; unknown ids are skipped, as Hugging Face does; with skip_special_tokens,
  // so are the added tokens marked special.
  std::string Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // One past the largest id of the vocabulary and the added tokens (the embedding rows needed).
  int32_t vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The raw vocabulary string of `id` (byte-level or '▁' spelling); empty for an unknown id.
  std::string IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  const TokenizerConfig& config() const;

  // Internal: what StreamDecoder and the pipeline share.
  const TokenizerTables& tables() const { return *tables_; }

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerTables> tables) : tables_(std::move(tables)) {}
  std::shared_ptr<const TokenizerTables> tables_;
};

// Decodes ids one at a time for streaming output. Push returns only text that is final: never
// a partial UTF-8 sequence (a token may end inside a character, and <0xNN> byte tokens combine),
// and the concatenation of every Push and the final Flush equals Decode of all the ids.
//
// Cost: each Push decodes the ids since the last emitted text plus a short context (one token,
// or the run of byte tokens it ended), so it stays O(1) per token for ordinary text.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  std::string Push(int32_t id);
  // Returns whatever is still held back (e.g. an unfinished character, as U+FFFD) and resets.
  std::string Flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> window_;  // context ids followed by ids whose text is not yet returned
  size_t context_size_ = 0;
  std::string context_text_;  // Decode of the context ids
};

}  // namespace moetier::text
