// moetier template: the prompt text a model's chat template makes of a conversation, exactly as
// transformers' apply_chat_template(..., tokenize=False) renders it.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "text/template/chat_template.h"
#include "text/template/value.h"

namespace moetier::cli {

Command AddTemplateCommand(CLI::App& root) {
  struct Opts {
    std::string model_dir;
    std::string messages_file;
    bool add_generation_prompt = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "template",
      "Render the model's chat template for a conversation and print the text, byte for byte, "
      "with nothing added (no trailing newline). The template is chat_template.jinja in the model "
      "directory, else the \"chat_template\" of tokenizer_config.json; bos/eos/unk/pad tokens come "
      "from tokenizer_config.json. The template sees what transformers gives it: messages, tools "
      "(none when absent), add_generation_prompt and the special tokens. A template that rejects "
      "the conversation (raise_exception) fails with its message.");
  cmd->add_option("--model", o->model_dir, "Model directory (may hold only tokenizer_config.json)")
      ->required();
  cmd->add_option("--messages", o->messages_file,
                  "JSON file {\"messages\": [{\"role\": ..., \"content\": ...}, ...], "
                  "\"tools\": [...]} as in the OpenAI chat API; \"tools\" is optional, and an "
                  "optional \"chat_template_kwargs\" object adds template variables "
                  "(e.g. {\"enable_thinking\": false})")
      ->required();
  cmd->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "End with the header of an assistant turn, so the model writes the reply");

  return {
      cmd, [o]() -> int {
        auto tmpl = text::ChatTemplate::Load(o->model_dir);
        if (!tmpl.ok()) return ReportError(tmpl.message());

        auto text_in = ReadInputFile(o->messages_file, "--messages");
        if (!text_in.ok()) return ReportError(text_in.message());
        const auto doc = nlohmann::ordered_json::parse(*text_in, nullptr,
                                                       /*allow_exceptions=*/false);
        if (doc.is_discarded()) return ReportError(o->messages_file + ": not valid JSON");
        // Before anything copies the document (nlohmann's copy recurses once per level).
        if (Status deep = text::jinja::CheckJsonNesting(doc); !deep.ok())
          return ReportError(o->messages_file + ": " + deep.message());
        if (!doc.is_object()) {
          return ReportError(o->messages_file + ": expected an object {\"messages\": [...]}");
        }
        text::ChatTemplateInputs inputs;
        auto messages = doc.find("messages");
        if (messages == doc.end() || !messages->is_array()) {
          return ReportError(o->messages_file + ": \"messages\" must be a list of messages");
        }
        inputs.messages = *messages;
        if (auto tools = doc.find("tools"); tools != doc.end() && !tools->is_null()) {
          if (!tools->is_array()) {
            return ReportError(o->messages_file + ": \"tools\" must be a list of tools");
          }
          inputs.tools = *tools;
        }
        if (auto kwargs = doc.find("chat_template_kwargs");
            kwargs != doc.end() && !kwargs->is_null()) {
          if (!kwargs->is_object()) {
            return ReportError(o->messages_file + ": \"chat_template_kwargs\" must be an object");
          }
          inputs.extra = *kwargs;
        }
        inputs.add_generation_prompt = o->add_generation_prompt;

        auto text = tmpl->Render(inputs);
        // The template's own errors ("chat template line 3: ...") get the model directory.
        if (!text.ok()) return ReportError(o->model_dir + ": " + text.message());
        if (std::fwrite(text->data(), 1, text->size(), stdout) != text->size() ||
            std::fflush(stdout) != 0) {
          return ReportError("stdout: write failed");
        }
        return 0;
      }};
}

}  // namespace moetier::cli
