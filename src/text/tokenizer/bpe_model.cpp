#include "text/tokenizer/bpe_model.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "text/tokenizer/utf8.h"

namespace moetier::text {
namespace {

// Words at least this long (bytes) are not cached, as in Hugging Face: long pieces are rare and
// unlikely to repeat (a SentencePiece model without a pre-tokenizer sees whole lines).
constexpr size_t kMaxCachedWordBytes = 256;
// Bound on cached words (~100 bytes each); once full, new words are computed but not kept.
constexpr size_t kMaxCachedWords = 1 << 17;
// How far the largest vocabulary id may exceed twice the vocabulary size.
constexpr int64_t kMaxIdSlack = 1 << 16;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 '▁'

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// A 64-bit hash of a short string, 8 bytes at a time (splitmix64's finalizer as the mixer).
uint64_t HashWord(std::string_view s) {
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = mix(h ^ v);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  return mix(h ^ tail) | 1;  // 0 marks an empty slot
}

// Word -> ids, as one flat open-addressing table over two arenas: a lookup is a hash, one or two
// probes and a memcmp, with no allocation and little pointer chasing (the node-based
// std::unordered_map cost more than the rest of encoding on English text).
struct BpeModel::Cache {
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_offset = 0;
    uint32_t key_length = 0;
    uint32_t ids_offset = 0;
    uint32_t ids_count = 0;
  };
  std::shared_mutex mu;
  std::vector<Slot> slots = std::vector<Slot>(1024);  // power of two, at most half full
  std::string keys;
  std::vector<int32_t> ids;
  size_t used = 0;

  const Slot* Find(std::string_view word, uint64_t hash) const {
    const size_t mask = slots.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.hash == 0) return nullptr;
      if (s.hash == hash && s.key_length == word.size() &&
          std::memcmp(keys.data() + s.key_offset, word.data(), word.size()) == 0) {
        return &s;
      }
    }
  }

  void Insert(std::string_view word, uint64_t hash, const int32_t* word_ids, size_t n) {
    if (used >= kMaxCachedWords || Find(word, hash) != nullptr) return;
    if (2 * (used + 1) > slots.size()) Grow();
    Slot slot{hash, static_cast<uint32_t>(keys.size()), static_cast<uint32_t>(word.size()),
              static_cast<uint32_t>(ids.size()), static_cast<uint32_t>(n)};
    keys.append(word);
    ids.insert(ids.end(), word_ids, word_ids + n);
    Place(slot);
    ++used;
  }

  void Place(const Slot& slot) {
    const size_t mask = slots.size() - 1;
    size_t i = slot.hash & mask;
    while (slots[i].hash != 0) i = (i + 1) & mask;
    slots[i] = slot;
  }

  void Grow() {
    std::vector<Slot> old(slots.size() * 2);
    old.swap(slots);
    for (const Slot& s : old) {
      if (s.hash != 0) Place(s);
    }
  }
};

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {
  byte_token_ids_.fill(-1);
}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

Expected<BpeModel> BpeModel::FromJson(const Json& j, std::string_view path) {
  BpeModel m;
  if (const auto it = j.find("dropout"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0) {
      return FieldError(JoinPath(path, "dropout"),
                        "BPE dropout makes encoding random; only null or 0 is supported");
    }
  }
  MT_ASSIGN_OR_RETURN(m.fuse_unk_, OptionalBool(j, "fuse_unk", path, false));
  MT_ASSIGN_OR_RETURN(m.byte_fallback_, OptionalBool(j, "byte_fallback", path, false));
  MT_ASSIGN_OR_RETURN(m.ignore_merges_, OptionalBool(j, "ignore_merges", path, false));
  MT_ASSIGN_OR_RETURN(auto prefix, OptionalString(j, "continuing_subword_prefix", path));
  MT_ASSIGN_OR_RETURN(auto suffix, OptionalString(j, "end_of_word_suffix", path));
  m.continuing_subword_prefix_ = prefix.value_or("");
  m.end_of_word_suffix_ = suffix.value_or("");

  const auto vocab = j.find("vocab");
  if (vocab == j.end()) return FieldError(JoinPath(path, "vocab"), "missing");
  if (!vocab->is_object()) return FieldError(JoinPath(path, "vocab"), "expected an object");
  m.vocab_.reserve(vocab->size());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0x7FFFFFFF) {
      return FieldError(JoinPath(path, "vocab"),
                        "id of token \"" + token + "\" is not an integer in [0, 2^31)");
    }
    if (!IsValidUtf8(token)) {
      return FieldError(JoinPath(path, "vocab"), "a token is not valid UTF-8");
    }
    const auto value = static_cast<int32_t>(id.get<uint64_t>());
    m.vocab_[token] = value;
    max_id = std::max<int64_t>(max_id, value);
  }
  // Real vocabularies number their tokens densely; a sparse one would make this table huge.
  if (max_id > 2 * static_cast<int64_t>(m.vocab_.size()) + kMaxIdSlack) {
    return FieldError(JoinPath(path, "vocab"), "ids are far from dense (largest id " +
                                                   std::to_string(max_id) + " for " +
                                                   std::to_string(m.vocab_.size()) + " tokens)");
  }
  m.id_to_token_.resize(static_cast<size_t>(max_id + 1));
  m.id_present_.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : m.vocab_) {
    m.id_to_token_[static_cast<size_t>(id)] = token;
    m.id_present_[static_cast<size_t>(id)] = 1;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (const auto it = m.vocab_.find(std::string_view(name)); it != m.vocab_.end()) {
      m.byte_token_ids_[static_cast<size_t>(b)] = it->second;
    }
  }

  m.split_before_metaspace_ =
      !m.ignore_merges_ && m.continuing_subword_prefix_.empty() && m.end_of_word_suffix_.empty();
  for (const auto& [token, id] : m.vocab_) {
    for (size_t at = token.find(kMetaspace); at != std::string::npos && m.split_before_metaspace_;
         at = token.find(kMetaspace, at + 1)) {
      if (at > 0 && !std::string_view(token).substr(0, at).ends_with(kMetaspace)) {
        m.split_before_metaspace_ = false;
      }
    }
  }

  MT_ASSIGN_OR_RETURN(auto unk, OptionalString(j, "unk_token", path));
  if (unk) {
    const auto it = m.vocab_.find(*unk);
    if (it == m.vocab_.end()) {
      return FieldError(JoinPath(path, "unk_token"),
                        "token \"" + *unk + "\" is not in the vocabulary");
    }
    m.unk_id_ = it->second;
  }

  const auto merges = j.find("merges");
  if (merges == j.end() || merges->is_null()) return m;  // a BPE without merges is valid
  if (!merges->is_array()) return FieldError(JoinPath(path, "merges"), "expected an array");
  m.merges_.reserve(merges->size());
  const size_t prefix_len = m.continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& entry = (*merges)[rank];
    const std::string where = JoinPath(path, "merges[" + std::to_string(rank) + "]");
    std::string left, right;
    if (entry.is_string()) {
      // The "a b" form cannot hold tokens with spaces, so it has exactly one.
      const std::string line = entry.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return FieldError(where, "expected \"left right\" with one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      return FieldError(where, "expected \"left right\" or [\"left\", \"right\"]");
    }
    const auto l = m.vocab_.find(left);
    const auto r = m.vocab_.find(right);
    if (l == m.vocab_.end() || r == m.vocab_.end()) {
      const std::string& missing = l == m.vocab_.end() ? left : right;
      return FieldError(where, "token \"" + missing + "\" is not in the vocabulary");
    }
    std::string merged = left;
    if (prefix_len > 0 && right.starts_with(m.continuing_subword_prefix_)) {
      merged += right.substr(prefix_len);
    } else {
      merged += right;
    }
    const auto n = m.vocab_.find(merged);
    if (n == m.vocab_.end()) {
      return FieldError(where, "the merged token \"" + merged + "\" is not in the vocabulary");
    }
    // A repeated pair keeps the later rank, as a Rust HashMap built from the list does.
    m.merges_[PairKey(l->second, r->second)] = Merge{static_cast<int32_t>(rank), n->second};
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) {
    return nullptr;
  }
  return &id_to_token_[static_cast<size_t>(id)];
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view word, const ByteLevelAlphabet* spell_bytes,
                        std::vector<int32_t>& out) const {
  if (word.empty()) return;
  // Raw bytes are never cut: the '▁' check was made on the vocabulary's spelling.
  if (!split_before_metaspace_ || spell_bytes != nullptr) {
    TokenizeWord(word, spell_bytes, out);
    return;
  }
  size_t begin = 0;
  for (size_t at = word.find(kMetaspace, 1); at != std::string_view::npos;
       at = word.find(kMetaspace, at + kMetaspace.size())) {
    if (word.substr(0, at).ends_with(kMetaspace)) continue;  // inside a run of '▁'
    TokenizeWord(word.substr(begin, at - begin), nullptr, out);
    begin = at;
  }
  TokenizeWord(word.substr(begin), nullptr, out);
}

void BpeModel::TokenizeWord(std::string_view word, const ByteLevelAlphabet* spell_bytes,
                            std::vector<int32_t>& out) const {
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  const uint64_t hash = cacheable ? HashWord(word) : 0;
  if (cacheable) {
    std::shared_lock lock(cache_->mu);
    if (const Cache::Slot* hit = cache_->Find(word, hash)) {
      const int32_t* ids = cache_->ids.data() + hit->ids_offset;
      out.insert(out.end(), ids, ids + hit->ids_count);
      return;
    }
  }
  std::string spelled;
  std::string_view model_word = word;
  if (spell_bytes != nullptr) {
    spell_bytes->EncodeAppend(word, spelled);
    model_word = spelled;
  }
  const size_t first = out.size();
  const auto whole = ignore_merges_ ? vocab_.find(model_word) : vocab_.end();
  if (whole != vocab_.end()) {
    out.push_back(whole->second);  // ignore_merges: a word in the vocabulary is one token
  } else {
    MergeWord(model_word, out);
  }
  if (cacheable) {
    std::unique_lock lock(cache_->mu);
    cache_->Insert(word, hash, out.data() + first, out.size() - first);
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id) {
    const auto index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, true});
  };

  // Pending unknown characters: Hugging Face adds an unk when the run ends (fused or not).
  bool unk_pending = false;
  std::string decorated;
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t begin = pos;
    pos += Utf8SequenceLength(static_cast<unsigned char>(word[pos]));
    if (pos > word.size()) pos = word.size();
    std::string_view symbol = word.substr(begin, pos - begin);
    const bool needs_prefix = begin > 0 && !continuing_subword_prefix_.empty();
    const bool needs_suffix = pos == word.size() && !end_of_word_suffix_.empty();
    if (needs_prefix || needs_suffix) {
      decorated.clear();
      if (needs_prefix) decorated += continuing_subword_prefix_;
      decorated += symbol;
      if (needs_suffix) decorated += end_of_word_suffix_;
      symbol = decorated;
    }
    if (const auto it = vocab_.find(symbol); it != vocab_.end()) {
      if (unk_pending) {
        add(*unk_id_);
        unk_pending = false;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (const char c : symbol) all_bytes &= byte_token_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        // As in Hugging Face, a pending unk is not flushed here (it follows these bytes).
        for (const char c : symbol) add(byte_token_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_pending && !fuse_unk_) add(*unk_id_);
      unk_pending = true;
    }
  }
  if (unk_pending) add(*unk_id_);

  // Lowest rank first, then leftmost: the order Hugging Face's queue pops merges in.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(cur.next)];
    // A queued pair may be stale: the neighbours changed since it was pushed.
    const Merge* m = FindMerge(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) symbols[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* pm = FindMerge(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push({pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const Merge* nm = FindMerge(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push({nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace moetier::text
