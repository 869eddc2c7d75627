// A non-owning reference to a callable: what a function taking a callback for the duration of
// the call needs, without std::function's heap allocation when the lambda captures more than
// two words (the decode loop's parallel jobs capture a dozen references).
//
// The referenced callable must outlive every call through the FunctionRef; passing a lambda
// straight to a function parameter of this type satisfies that.
#pragma once

#include <type_traits>
#include <utility>

namespace moetier {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef> &&
                                                    std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like a function type
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace moetier
