#include "model/arch/arch.h"

namespace moetier::arch {

namespace {
const ArchSpec* const* AllSpecs(size_t& n) {
  static const ArchSpec* const specs[] = {&Qwen3MoeSpec(), &MixtralSpec()};
  n = std::size(specs);
  return specs;
}
}  // namespace

const ArchSpec* FindArch(std::string_view hf_name) {
  size_t n;
  const ArchSpec* const* specs = AllSpecs(n);
  for (size_t i = 0; i < n; ++i)
    if (specs[i]->hf_name == hf_name) return specs[i];
  return nullptr;
}

std::string SupportedArchNames() {
  size_t n;
  const ArchSpec* const* specs = AllSpecs(n);
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += specs[i]->hf_name;
  }
  return s;
}

}  // namespace moetier::arch
