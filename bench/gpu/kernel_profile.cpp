// A CUDA injection library that times every kernel and copy the process runs on the GPU (CUPTI's
// activity records, which include the kernels of replayed CUDA graphs) and prints, at exit, a
// table of them (by kernel and grid size) by total device time: where a step's GPU time goes,
// without nsys.
//
//   CUDA_INJECTION64_PATH=build/bench/gpu/libmoetier_kernel_profile.so moetier bench ...
//
// MOETIER_KPROF_OUT=file writes the table there instead of stderr; MOETIER_KPROF_TOP=N keeps
// its first N rows (default 40).
//
// A second table gives each kind's share of the wall time of a chain of work on one stream,
// which is what matters when kernels overlap under programmatic dependent launch (a kernel's
// own interval then includes waiting for the one before it): the records in the order they
// end, each is charged from the later of its start and the previous record's end to its own
// end. Time when nothing ran (the host between steps) is the row "[idle]".
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

struct Interval {
  uint64_t start = 0;
  uint64_t end = 0;
  const std::string* kind = nullptr;  // a key of Table()
};

std::mutex mu;
std::map<std::string, Totals>& Table() {
  static auto* t = new std::map<std::string, Totals>;
  return *t;
}
std::vector<Interval>& Intervals() {
  static auto* v = new std::vector<Interval>;
  return *v;
}

// Adds one record of `kind` over [start, end) to both tables.
Totals& Record(const std::string& kind, uint64_t start, uint64_t end) {
  auto it = Table().try_emplace(kind).first;
  Totals& t = it->second;
  ++t.count;
  t.ns += end - start;
  Intervals().push_back({start, end, &it->first});
  return t;
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
      Record(ShortName(k->name) + " <<<" + std::to_string(blocks) + ">>>", k->start, k->end);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      Record("[memcpy kind " + std::to_string(m->copyKind) + "]", m->start, m->end).bytes +=
          m->bytes;
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(r);
      Record("[memset]", m->start, m->end);
    }
  }
  std::free(buffer);
}

// Each kind's share of the wall time (see the top of the file), by kind.
std::map<std::string, uint64_t> WallShares() {
  std::vector<Interval>& v = Intervals();
  std::sort(v.begin(), v.end(), [](const Interval& a, const Interval& b) { return a.end < b.end; });
  std::map<std::string, uint64_t> wall;
  uint64_t last_end = v.empty() ? 0 : v.front().start;
  for (const Interval& r : v) {
    if (r.end <= last_end) continue;  // ended inside another's time: adds no wall time
    if (r.start > last_end) wall["[idle]"] += r.start - last_end;
    wall[*r.kind] += r.end - std::max(r.start, last_end);
    last_end = r.end;
  }
  return wall;
}

void PrintWall(FILE* f, size_t n) {
  const std::map<std::string, uint64_t> wall = WallShares();
  std::vector<std::pair<std::string, uint64_t>> rows(wall.begin(), wall.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  uint64_t total = 0;
  for (const auto& [name, ns] : rows) total += ns;
  std::fprintf(f, "\nwall time: %.3f ms, by kind (charged from the previous end)\n", total * 1e-6);
  std::fprintf(f, "%10s %8s %9s %6s  %s\n", "wall_ms", "count", "mean_us", "share", "name");
  for (size_t i = 0; i < std::min(n, rows.size()); ++i) {
    const auto found = Table().find(rows[i].first);
    const int64_t count = found != Table().end() ? found->second.count : 0;
    std::fprintf(
        f, "%10.3f %8lld %9.2f %5.1f%%  %s\n", rows[i].second * 1e-6, static_cast<long long>(count),
        count > 0 ? rows[i].second * 1e-3 / static_cast<double>(count) : 0.0,
        100.0 * static_cast<double>(rows[i].second) / static_cast<double>(total ? total : 1),
        rows[i].first.c_str());
  }
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
  PrintWall(f, n);
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
