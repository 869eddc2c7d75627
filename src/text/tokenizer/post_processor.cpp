#include "text/tokenizer/post_processor.h"

#include <string>
#include <utility>

namespace moetier::text {
namespace {

// RobertaProcessing / BertProcessing store a token as ["text", id].
Expected<int32_t> TokenPairId(const Json& j, std::string_view key, std::string_view path) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_unsigned() ||
      (*it)[1].get<uint64_t>() > 0x7FFFFFFF) {
    return FieldError(JoinPath(path, key), "expected [\"token\", id]");
  }
  return static_cast<int32_t>((*it)[1].get<uint64_t>());
}

}  // namespace

Expected<PostProcessor> PostProcessor::FromJson(const Json& j, std::string_view path) {
  PostProcessor p;
  if (j.is_null()) return p;
  MT_RETURN_IF_ERROR(p.AddFromJson(j, path));
  return p;
}

PostProcessor PostProcessor::BosEos(std::vector<int32_t> bos_ids, std::vector<int32_t> eos_ids) {
  PostProcessor p;
  std::vector<Item> items;
  if (!bos_ids.empty()) items.push_back({false, std::move(bos_ids)});
  items.push_back({true, {}});
  if (!eos_ids.empty()) items.push_back({false, std::move(eos_ids)});
  p.templates_.push_back(std::move(items));
  return p;
}

Status PostProcessor::AddFromJson(const Json& j, std::string_view path) {
  if (!j.is_object()) return FieldError(path, "expected an object");
  // Bound by reference: GCC 12 misreports a string moved out of the Expected as uninitialized.
  const auto type_or = RequiredString(j, "type", path);
  if (!type_or.ok()) return type_or.status();
  const std::string& type = type_or.value();
  if (type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return FieldError(JoinPath(path, "processors"), "expected an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      MT_RETURN_IF_ERROR(
          AddFromJson((*it)[i], JoinPath(path, "processors[" + std::to_string(i) + "]")));
    }
    return OkStatus();
  }
  if (type == "ByteLevel") return OkStatus();  // only adjusts offsets, never ids
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    MT_ASSIGN_OR_RETURN(const int32_t cls, TokenPairId(j, "cls", path));
    MT_ASSIGN_OR_RETURN(const int32_t sep, TokenPairId(j, "sep", path));
    templates_.push_back({{false, {cls}}, {true, {}}, {false, {sep}}});
    return OkStatus();
  }
  if (type != "TemplateProcessing") {
    return FieldError(JoinPath(path, "type"),
                      "unsupported post-processor \"" + type +
                          "\" (supported: TemplateProcessing, RobertaProcessing, "
                          "BertProcessing, ByteLevel, Sequence)");
  }
  const auto single = j.find("single");
  if (single == j.end() || !single->is_array()) {
    return FieldError(JoinPath(path, "single"), "expected an array");
  }
  const auto specials = j.find("special_tokens");
  std::vector<Item> items;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string where = JoinPath(path, "single[" + std::to_string(i) + "]");
    if (item.contains("Sequence")) {
      items.push_back({true, {}});
      continue;
    }
    const auto special = item.find("SpecialToken");
    if (special == item.end() || !special->is_object()) {
      return FieldError(where, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    MT_ASSIGN_OR_RETURN(const std::string name, RequiredString(*special, "id", where));
    if (specials == j.end() || !specials->is_object() || !specials->contains(name)) {
      return FieldError(JoinPath(path, "special_tokens"), "has no entry for \"" + name + "\"");
    }
    const Json& entry = (*specials)[name];
    const auto ids = entry.find("ids");
    if (ids == entry.end() || !ids->is_array()) {
      return FieldError(JoinPath(path, "special_tokens." + name + ".ids"), "expected an array");
    }
    Item special_item;
    for (const Json& id : *ids) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() > 0x7FFFFFFF) {
        return FieldError(JoinPath(path, "special_tokens." + name + ".ids"),
                          "expected non-negative integer ids");
      }
      special_item.ids.push_back(static_cast<int32_t>(id.get<uint64_t>()));
    }
    items.push_back(std::move(special_item));
  }
  templates_.push_back(std::move(items));
  return OkStatus();
}

std::vector<int32_t> PostProcessor::Apply(std::vector<int32_t> ids) const {
  for (const auto& items : templates_) {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Item& item : items) {
      if (item.is_sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    ids = std::move(out);
  }
  return ids;
}

}  // namespace moetier::text
