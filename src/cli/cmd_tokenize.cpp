// moetier tokenize: the token ids of each line of a file, for checks against a reference
// tokenizer (the ids equal Hugging Face's, token for token).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "text/tokenizer/tokenizer.h"

namespace moetier::cli {

Command AddTokenizeCommand(CLI::App& root) {
  struct Opts {
    std::string model_dir;
    std::string file;
    bool add_special = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize",
      "Print the token ids of each line of a file, one line of comma-separated ids per input "
      "line, using the model's tokenizer.json (and tokenizer_config.json). Lines are split on "
      "'\\n' only; the '\\n' is not part of the line, and the empty line after a final '\\n' is "
      "not printed. Bytes that are not valid UTF-8 are read as U+FFFD.");
  cmd->add_option("--model", o->model_dir,
                  "Model directory holding tokenizer.json (Hugging Face layout)")
      ->required();
  cmd->add_option("--file", o->file, "Text file to tokenize")->required();
  cmd->add_flag("--add-special", o->add_special,
                "Add the tokenizer's special tokens around each line (e.g. BOS), as "
                "transformers does by default; without it, only the text's own tokens");

  return {cmd, [o]() -> int {
            auto tokenizer = text::Tokenizer::Load(o->model_dir);
            if (!tokenizer.ok()) return ReportError(tokenizer.message());
            auto text = ReadInputFile(o->file, "--file");
            if (!text.ok()) return ReportError(text.message());
            const std::string& content = *text;

            std::string out;
            size_t start = 0;
            while (start < content.size()) {
              size_t end = content.find('\n', start);
              if (end == std::string::npos) end = content.size();
              const std::vector<int32_t> ids = tokenizer->Encode(
                  std::string_view(content).substr(start, end - start), o->add_special);
              for (size_t i = 0; i < ids.size(); ++i) {
                if (i > 0) out.push_back(',');
                out += std::to_string(ids[i]);
              }
              out.push_back('\n');
              start = end + 1;
              // Write in large blocks: a file may hold many thousands of lines.
              if (out.size() > (1 << 16)) {
                if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
                  return ReportError("stdout: write failed");
                }
                out.clear();
              }
            }
            if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() ||
                std::fflush(stdout) != 0) {
              return ReportError("stdout: write failed");
            }
            return 0;
          }};
}

}  // namespace moetier::cli
