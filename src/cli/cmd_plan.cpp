// moetier plan: where each MoE layer's experts would live, without reading a weight.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "experts/residency_report.h"

namespace moetier::cli {

Command AddPlanCommand(CLI::App& root) {
  struct Opts {
    ModelOptions model;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = root.add_subcommand(
      "plan",
      "Print the residency plan (the tier of each MoE layer's expert bank under the budgets and "
      "flags) without reading weights.");
  cmd->add_option("-m,--model", o->model.model_dir, "Model directory (Hugging Face or converted)")
      ->required();
  AddResidencyOptions(*cmd, o->model);
  cmd->add_flag("--json", o->json,
                "Print the plan as JSON (the shape of --report, without 'settled')");
  return {cmd, [o]() -> int {
            auto opts = ToResidencyOptions(o->model);
            if (!opts.ok()) return ReportError(opts.message());
            auto r = PlanModelResidency(o->model.model_dir, *opts);
            if (!r.ok()) return ReportError(r.message());
            if (o->json) {
              std::printf("%s\n", ResidencyReportJson(*r).dump(2).c_str());
              return 0;
            }
            const ResidencyPlan& p = r->plan;
            auto budget = [](const std::optional<uint64_t>& b) {
              return b ? std::to_string(static_cast<double>(*b) / 1e9).substr(0, 6) + " GB"
                       : std::string("uncapped");
            };
            std::printf("backend: %s\npin budget: %s (%s)\nlock budget: %s (%s)\n",
                        std::string(BackendName(p.backend)).c_str(),
                        budget(p.budgets.pin_bytes).c_str(), p.budgets.pin_source.c_str(),
                        budget(p.budgets.lock_bytes).c_str(), p.budgets.lock_source.c_str());
            for (const auto& l : p.layers)
              std::printf("layer %3lld  %-8s %10.3f GB  %s\n", static_cast<long long>(l.layer),
                          std::string(TierName(l.tier)).c_str(), static_cast<double>(l.bytes) / 1e9,
                          std::string(DTypeName(l.dtype)).c_str());
            for (const auto& line : TierSummaryLines(p.layers)) std::printf("%s\n", line.c_str());
            for (const auto& w : r->warnings) std::printf("warning: %s\n", w.c_str());
            return 0;
          }};
}

}  // namespace moetier::cli
