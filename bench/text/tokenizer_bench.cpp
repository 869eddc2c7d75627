// Encode throughput on English text, single-threaded, for the two real tokenizers of the test
// fixtures (Qwen3: byte-level BPE with a regex pre-tokenizer; Mixtral: SentencePiece-style BPE
// that merges whole lines). Prints one JSON object per tokenizer:
//   {"tokenizer": ..., "mb": ..., "runs": ..., "mb_per_s": ..., "tokens_per_s": ...,
//    "wall_mb_per_s": ...}
// with the median of the runs. mb_per_s and tokens_per_s divide by the thread's CPU time, which
// is the per-core figure and stays honest on a machine shared with other work; wall_mb_per_s
// divides by elapsed time. The text is the English prose of the test corpus, repeated to
// the requested size and cut into ~64 KiB documents; the first run warms the BPE word cache,
// as a server's first requests would.
//
// Usage: tokenizer_bench [--fixtures DIR] [--mb N] [--runs R] [--only qwen3|mixtral]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer/tokenizer.h"

namespace {

using moetier::text::Tokenizer;

// Size of one Encode call: a long prompt or a document chunk.
constexpr size_t kDocumentBytes = 64 * 1024;

// A corpus line counts as English prose when it is ASCII, mostly letters and spaces, and has
// no markup (no '<', '{', '=' or '/'), which leaves out code, URLs and special-token lines.
bool IsEnglishProse(const std::string& line) {
  if (line.size() < 20) return false;
  size_t letters = 0;
  for (const char c : line) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80 || c == '<' || c == '{' || c == '=' || c == '/' || c == '\t' || c == '\r') {
      return false;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' ') ++letters;
  }
  return letters * 10 >= line.size() * 9;
}

std::vector<std::string> MakeDocuments(const std::filesystem::path& corpus, size_t total_bytes) {
  std::ifstream in(corpus, std::ios::binary);
  std::vector<std::string> prose;
  for (std::string line; std::getline(in, line);) {
    if (IsEnglishProse(line)) prose.push_back(line);
  }
  std::vector<std::string> docs;
  if (prose.empty()) return docs;
  std::string doc;
  size_t produced = 0;
  for (size_t i = 0; produced < total_bytes; ++i) {
    doc += prose[i % prose.size()];
    doc += '\n';
    if (doc.size() >= kDocumentBytes) {
      produced += doc.size();
      docs.push_back(std::move(doc));
      doc.clear();
    }
  }
  return docs;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void Run(const char* name, const std::filesystem::path& dir, const std::vector<std::string>& docs,
         int runs) {
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.message().c_str());
    std::exit(1);
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::vector<double> cpu_seconds, wall_seconds;
  size_t tokens = 0;
  for (int r = 0; r < runs; ++r) {
    tokens = 0;
    const double cpu_start = ThreadCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    for (const auto& d : docs) tokens += tokenizer->Encode(d, false).size();
    wall_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    cpu_seconds.push_back(ThreadCpuSeconds() - cpu_start);
  }
  std::sort(cpu_seconds.begin(), cpu_seconds.end());
  std::sort(wall_seconds.begin(), wall_seconds.end());
  const double cpu = cpu_seconds[cpu_seconds.size() / 2];
  const double wall = wall_seconds[wall_seconds.size() / 2];
  const double mb = static_cast<double>(bytes) / 1e6;
  std::printf(
      "{\"tokenizer\": \"%s\", \"mb\": %.2f, \"runs\": %d, \"tokens\": %zu, \"mb_per_s\": %.2f, "
      "\"tokens_per_s\": %.0f, \"wall_mb_per_s\": %.2f}\n",
      name, mb, runs, tokens, mb / cpu, static_cast<double>(tokens) / cpu, mb / wall);
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path fixtures = MOETIER_FIXTURES_DIR;
  double total_mb = 4;
  int runs = 5;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--fixtures") {
      fixtures = argv[i + 1];
    } else if (flag == "--mb") {
      total_mb = std::atof(argv[i + 1]);
    } else if (flag == "--only") {
      only = argv[i + 1];
    } else if (flag == "--runs") {
      runs = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench [--fixtures DIR] [--mb N] [--runs R] [--only NAME]\n");
      return 2;
    }
  }
  const auto docs =
      MakeDocuments(fixtures / "text/tokenizer/corpus.txt", static_cast<size_t>(total_mb * 1e6));
  if (docs.empty()) {
    std::fprintf(stderr, "error: no English prose found in %s\n",
                 (fixtures / "text/tokenizer/corpus.txt").c_str());
    return 1;
  }
  if (only.empty() || only == "qwen3") {
    Run("qwen3", fixtures / "hf/realvocab/qwen3_moe_tiny", docs, runs);
  }
  if (only.empty() || only == "mixtral") {
    Run("mixtral", fixtures / "hf/realvocab/mixtral_tiny", docs, runs);
  }
  return 0;
}
