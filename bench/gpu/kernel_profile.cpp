// A CUDA injection library that times every kernel and copy the process runs on the GPU (CUPTI's
// activity records, which include the kernels of replayed CUDA graphs) and prints, at exit, a
// table of them (by kernel and grid size) by total device time: where a step's GPU time goes,
// without nsys.
//
//   CUDA_INJECTION64_PATH=build/bench/gpu/libmoetier_kernel_profile.so moetier bench ...
//
// MOETIER_KPROF_OUT=file writes the table there instead of stderr; MOETIER_KPROF_TOP=N keeps
// its first N rows (default 40).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Totals {
  int64_t count = 0;
  uint64_t ns = 0;
  uint64_t bytes = 0;
};

std::mutex mu;
std::map<std::string, Totals>& Table() {
  static auto* t = new std::map<std::string, Totals>;
  return *t;
}

constexpr size_t kBufferBytes = 16 << 20;

// A kernel's name without its template arguments' noise: demangled, cut at 110 characters.
std::string ShortName(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  if (s.size() > 110) s = s.substr(0, 110);
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
      // Keyed by the grid too: launches of one kernel over different shapes (a layer's
      // projections and lm_head) are rows of their own.
      const uint64_t blocks = static_cast<uint64_t>(k->gridX) * k->gridY * k->gridZ;
      Totals& t = Table()[ShortName(k->name) + " <<<" + std::to_string(blocks) + ">>>"];
      ++t.count;
      t.ns += k->end - k->start;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      Totals& t = Table()["[memcpy kind " + std::to_string(m->copyKind) + "]"];
      ++t.count;
      t.ns += m->end - m->start;
      t.bytes += m->bytes;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      Totals& t = Table()["[memset]"];
      ++t.count;
      t.ns += m->end - m->start;
    }
  }
  std::free(buffer);
}

void PrintTable() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(mu);
  std::vector<std::pair<std::string, Totals>> rows(Table().begin(), Table().end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  uint64_t total = 0;
  for (const auto& [name, t] : rows) total += t.ns;
  const char* out = std::getenv("MOETIER_KPROF_OUT");
  FILE* f = out != nullptr ? std::fopen(out, "w") : stderr;
  if (f == nullptr) f = stderr;
  const char* top = std::getenv("MOETIER_KPROF_TOP");
  const size_t n = std::min(rows.size(), static_cast<size_t>(top ? std::atoi(top) : 40));
  std::fprintf(f, "kernel profile: %.3f ms of device time in %zu kinds\n", total * 1e-6,
               rows.size());
  std::fprintf(f, "%10s %8s %9s %6s %8s  %s\n", "total_ms", "count", "mean_us", "share", "GB/s",
               "name");
  for (size_t i = 0; i < n; ++i) {
    const Totals& t = rows[i].second;
    std::fprintf(f, "%10.3f %8lld %9.2f %5.1f%% %8.1f  %s\n", t.ns * 1e-6,
                 static_cast<long long>(t.count), t.ns * 1e-3 / static_cast<double>(t.count),
                 100.0 * static_cast<double>(t.ns) / static_cast<double>(total ? total : 1),
                 t.ns ? static_cast<double>(t.bytes) / static_cast<double>(t.ns) : 0.0,
                 rows[i].first.c_str());
  }
  if (f != stderr) std::fclose(f);
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::atexit(PrintTable);
  return 1;
}
