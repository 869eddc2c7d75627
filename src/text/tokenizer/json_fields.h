// Typed reads of tokenizer.json fields that turn a wrong or missing field into a Status naming
// its path ("field `model.merges[3]`: expected a string"), so a hand-edited or truncated file
// gives a message a person can act on instead of an exception.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"

namespace moetier::text {

using Json = nlohmann::json;

inline Status FieldError(std::string_view path, std::string_view what) {
  return Status::Error("field `" + std::string(path) + "`: " + std::string(what));
}

inline std::string JoinPath(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : std::string(parent) + "." + std::string(key);
}

// A field that must be present and a string.
inline Expected<std::string> RequiredString(const Json& obj, std::string_view key,
                                            std::string_view parent) {
  const auto it = obj.find(key);
  if (it == obj.end()) return FieldError(JoinPath(parent, key), "missing");
  if (!it->is_string()) return FieldError(JoinPath(parent, key), "expected a string");
  return it->get<std::string>();
}

// A boolean field; absent or null gives `fallback`.
inline Expected<bool> OptionalBool(const Json& obj, std::string_view key, std::string_view parent,
                                   bool fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return FieldError(JoinPath(parent, key), "expected true or false");
  return it->get<bool>();
}

// A string field; absent or null gives nullopt.
inline Expected<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                           std::string_view parent) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) return FieldError(JoinPath(parent, key), "expected a string");
  return std::optional<std::string>(it->get<std::string>());
}

// A non-negative integer field that fits int64; absent or null gives `fallback`.
inline Expected<int64_t> OptionalCount(const Json& obj, std::string_view key,
                                       std::string_view parent, int64_t fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_unsigned()) {
    return FieldError(JoinPath(parent, key), "expected a non-negative integer");
  }
  return static_cast<int64_t>(it->get<uint64_t>() > uint64_t{1} << 62 ? uint64_t{1} << 62
                                                                      : it->get<uint64_t>());
}

}  // namespace moetier::text
