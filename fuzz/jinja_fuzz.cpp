// Fuzz target: parse and render arbitrary template bytes with a small fixed chat context.
// Must never crash, hang or exhaust memory: the interpreter's nesting, step, output and list
// limits (set low here so one input stays well under a second) turn runaway templates into
// errors.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "text/template/jinja.h"

namespace {

const nlohmann::ordered_json& Context() {
  static const nlohmann::ordered_json kContext = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <think>there</think>"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, "é"]}}}]},
      {"role": "tool", "content": "{\"ok\": true}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>", "eos_token": "</s>"
  })");
  return kContext;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using moetier::text::jinja::RenderOptions;
  using moetier::text::jinja::Template;
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto tmpl = Template::Parse(source);
  if (!tmpl.ok()) return 0;
  RenderOptions options;
  options.limits.max_output_bytes = size_t{1} << 20;
  options.limits.max_list_items = size_t{1} << 14;
  options.limits.max_steps = 200'000;
  options.limits.max_call_depth = 32;
  std::tm now{};
  now.tm_year = 125;
  options.now = now;
  (void)tmpl->Render(Context(), options);
  return 0;
}
