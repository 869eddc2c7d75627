// A Jinja template interpreter for the subset chat templates use: if/elif/else, for (with loop
// variables, else, inline filters, break/continue), set (also the block form and namespace
// attributes), macro and call blocks, filter blocks, the usual expressions, filters, tests and
// string and dict methods. It renders as @huggingface/jinja does, with transformers'
// trim_blocks and lstrip_blocks; where that differs from Python's Jinja2 (which transformers
// runs) by a JavaScript artifact, it follows Jinja2 — tests/fixtures/text/template/README.md
// lists those places.
//
// Errors are one line: "<name> line N: <what>" for syntax and runtime errors, and
// "<name> raised: <message>" when the template calls raise_exception(message).
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "text/template/interpreter.h"

namespace moetier::text::jinja {

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() sees as the current local time; the wall clock when unset. Tests fix it.
  std::optional<std::tm> now;
};

class Template {
 public:
  // `name` starts every error message ("chat template line 3: ...").
  static Expected<Template> Parse(std::string_view source, std::string name = "template");

  // `context` must be a JSON object; its keys become the template's variables.
  Expected<std::string> Render(const nlohmann::ordered_json& context) const;
  Expected<std::string> Render(const nlohmann::ordered_json& context,
                               const RenderOptions& options) const;

  const std::string& name() const { return name_; }

 private:
  Template(std::shared_ptr<const Body> body, std::string name)
      : body_(std::move(body)), name_(std::move(name)) {}

  std::shared_ptr<const Body> body_;  // immutable, so copies of a Template share it
  std::string name_;
};

}  // namespace moetier::text::jinja
