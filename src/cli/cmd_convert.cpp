// moetier convert: a Hugging Face checkpoint → the bank format.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "model/convert.h"

namespace moetier::cli {

Command AddConvertCommand(CLI::App& root) {
  struct Opts {
    std::string model, out;
    double shard_gib = 8;
    bool overwrite = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "convert",
      "Convert a Hugging Face checkpoint into moetier's bank format: each MoE layer's experts in "
      "one contiguous 4096-aligned bank, dense weights beside, an index with byte lengths and "
      "xxh64 checksums; config and tokenizer files are copied. Every command's --model accepts "
      "the result.");
  cmd->add_option("-m,--model", o->model, "Hugging Face model directory to convert")->required();
  cmd->add_option("-o,--out", o->out, "Output directory (must be empty or new)")->required();
  cmd->add_option("--shard-gib", o->shard_gib, "Start a new data file past this many GiB")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--overwrite", o->overwrite, "Replace the files of an earlier conversion in --out");
  return {cmd, [o]() -> int {
            ConvertOptions opts;
            opts.shard_bytes =
                static_cast<uint64_t>(o->shard_gib * static_cast<double>(1ull << 30));
            opts.overwrite = o->overwrite;
            auto r = ConvertCheckpoint(o->model, o->out, opts);
            if (!r.ok()) return ReportError(r.message());
            std::fprintf(stderr,
                         "wrote %s: %d data file(s), %.2f GB, %d expert banks, %d dense tensors\n",
                         o->out.c_str(), r->n_files, static_cast<double>(r->bytes_written) / 1e9,
                         r->n_banks, r->n_tensors);
            return 0;
          }};
}

}  // namespace moetier::cli
