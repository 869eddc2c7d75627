// The BPE model of tokenizer.json: a vocabulary, ranked merges, and the rules Hugging Face applies
// to a word (a pre-tokenized piece): split it into characters, look each up (or fall back to
// <0xNN> byte tokens, or the unk token, fused when fuse_unk), then merge the adjacent pair with
// the lowest rank, leftmost first, until no pair has a merge.
//
// Thread safety: Tokenize is const and may run concurrently; the word cache is guarded by a
// shared mutex. Cost: a cached word is one hash lookup; an uncached word of n characters is
// O(n log n) with a heap, so a long unsplit line (SentencePiece-style models have no
// pre-tokenizer) stays fast.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/tokenizer/byte_level.h"
#include "text/tokenizer/json_fields.h"

namespace moetier::text {

// Hash for heterogeneous lookup, so a std::string_view finds a std::string key without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `j` is the value of "model"; `path` names it in errors.
  static Expected<BpeModel> FromJson(const Json& j, std::string_view path);

  BpeModel();  // an empty vocabulary
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of `word` to `out`. `word` is in the vocabulary's spelling, or, when
  // `spell_bytes` is given, raw bytes that the alphabet spells on a cache miss (a tokenizer
  // calls this one way only, so its cache never mixes the two kinds of key).
  void Tokenize(std::string_view word, const ByteLevelAlphabet* spell_bytes,
                std::vector<int32_t>& out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The vocabulary string of `id`, or nullptr when the vocabulary has no such id.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  struct Cache;

  void TokenizeWord(std::string_view word, const ByteLevelAlphabet* spell_bytes,
                    std::vector<int32_t>& out) const;
  void MergeWord(std::string_view word, std::vector<int32_t>& out) const;
  const Merge* FindMerge(int32_t left, int32_t right) const;

  VocabMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> id_present_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  // Whether a word may be cut before each '▁' that follows another character: true when no
  // vocabulary token holds '▁' after another character, so no merge can cross such a cut and
  // the pieces merge exactly as the whole would. SentencePiece-style models have no
  // pre-tokenizer and hand whole lines to the model; the cut makes their words cacheable.
  bool split_before_metaspace_ = false;
  std::array<int32_t, 256> byte_token_ids_{};  // <0xNN> ids, -1 where absent
  std::unique_ptr<Cache> cache_;
};

}  // namespace moetier::text
