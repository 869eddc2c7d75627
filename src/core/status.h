// Status and Expected<T>: how every layer reports a failure the user can act on.
//
// Contract: a failed Status carries one line of text that names the file, tensor, flag or field
// at fault and, where it can, says what to do. The CLI prints it as is and exits non-zero;
// nothing below the CLI prints errors or exits.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace moetier {

class Status {
 public:
  Status() = default;  // success
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with context ("model.safetensors: " + message).
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + message_);
  }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

inline Status OkStatus() {
  return Status();
}

// A value or a failed Status. Access to value() of a failed Expected is a programming error.
template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  const std::string& message() const { return std::get<Status>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace moetier

// Returns early from a function returning Status or Expected<U> when `expr` failed.
#define MT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::moetier::Status mt_status_ = (expr);   \
    if (!mt_status_.ok()) return mt_status_; \
  } while (0)

#define MT_CONCAT_INNER(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_INNER(a, b)
// `MT_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the failure.
// __COUNTER__, not __LINE__: a call that wraps onto two lines must name one temporary.
#define MT_ASSIGN_OR_RETURN(lhs, expr) \
  MT_ASSIGN_OR_RETURN_IMPL(MT_CONCAT(mt_expected_, __COUNTER__), lhs, expr)
#define MT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
