#include "text/template/jinja.h"

#include <utility>

#include "text/template/builtins.h"
#include "text/template/lexer.h"
#include "text/template/parser.h"

namespace moetier::text::jinja {

Expected<Template> Template::Parse(std::string_view source, std::string name) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return Status::Error(name + " " + tokens.message());
  auto body = jinja::Parse(*tokens);
  if (!body.ok()) return Status::Error(name + " " + body.message());
  return Template(std::make_shared<const Body>(std::move(body).value()), std::move(name));
}

Expected<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  return Render(context, RenderOptions{});
}

Expected<std::string> Template::Render(const nlohmann::ordered_json& context,
                                       const RenderOptions& options) const {
  if (!context.is_object() && !context.is_null()) {
    return Status::Error(name_ + ": the render context must be a JSON object");
  }
  auto globals = std::make_shared<Scope>();
  InstallGlobals(globals.get());
  if (context.is_object()) {
    // Context keys may shadow globals, as keyword arguments of Jinja2's render() do.
    for (const auto& [key, value] : context.items()) {
      auto converted = FromJson(value);
      if (!converted.ok()) return Status::Error(name_ + ": \"" + key + "\" " + converted.message());
      globals->vars[key] = std::move(converted).value();
    }
  }
  Interpreter interpreter(options.limits, options.now);
  auto out = interpreter.Render(*body_, globals);
  if (interpreter.raised()) return Status::Error(name_ + " raised: " + *interpreter.raised());
  if (!out.ok()) return Status::Error(name_ + " " + out.message());
  return out;
}

}  // namespace moetier::text::jinja
