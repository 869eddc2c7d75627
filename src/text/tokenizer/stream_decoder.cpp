// StreamDecoder: returns text as soon as it can no longer change.
//
// Text can still change while (a) it ends in U+FFFD, which is how the decoders show a character
// whose remaining bytes have not arrived, or (b) the newest token is a <0xNN> byte token of a
// ByteFallback decoder: Hugging Face decodes a whole run of byte tokens at once and turns all of
// it into U+FFFD if any byte is bad, so even finished characters of the run may change until
// a non-byte token ends it. Otherwise the text of the pending ids is final.
//
// The pending ids are decoded after a context (the last token already returned), and only the
// part after the context's own text is returned: that keeps first-token rules (Metaspace's and
// Strip's leading-space handling) from applying again mid-stream.
#include "text/tokenizer/tokenizer.h"
#include "text/tokenizer/tokenizer_tables.h"
#include "text/tokenizer/utf8.h"

namespace moetier::text {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::Push(int32_t id) {
  const TokenizerTables& t = tokenizer_.tables();
  const std::string* token = t.TokenString(id);
  // Decode drops unknown ids and (when asked) special tokens, so they change nothing here.
  if (token == nullptr || (skip_special_ && t.IsSpecial(id))) return {};
  window_.push_back(id);
  if (t.decoder.MergesByteTokens() && Decoder::IsByteToken(*token)) return {};
  std::string text = tokenizer_.Decode(window_, skip_special_);
  if (text.size() <= context_text_.size() || !text.starts_with(context_text_) ||
      text.ends_with(kReplacementUtf8)) {
    return {};
  }
  std::string out = text.substr(context_text_.size());
  window_.erase(window_.begin(), window_.end() - 1);
  context_size_ = 1;
  context_text_ = tokenizer_.Decode(window_, skip_special_);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  if (window_.size() > context_size_) {
    const std::string text = tokenizer_.Decode(window_, skip_special_);
    out = text.starts_with(context_text_) ? text.substr(context_text_.size()) : text;
  }
  window_.clear();
  context_size_ = 0;
  context_text_.clear();
  return out;
}

}  // namespace moetier::text
