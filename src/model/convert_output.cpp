#include "model/convert_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "io/bank_index.h"

namespace moetier {

namespace fs = std::filesystem;

namespace {

std::string OutFlag(const fs::path& out) {
  return "--out " + out.string();
}

// `p` without a trailing separator ("a/b/" → "a/b"), so its filename and parent are the
// directory's own.
fs::path WithoutTrailingSeparator(const fs::path& p) {
  return p.has_filename() || !p.has_parent_path() ? p : p.parent_path();
}

// True when `inner` is `outer` or lies below it (both absolute, symlinks resolved).
bool IsWithin(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return false;
  return true;
}

// An existing --out must be an empty directory, or an earlier conversion and --overwrite.
Status CheckExistingOutput(const fs::path& dir, const std::string& flag, bool overwrite) {
  std::error_code ec;
  const bool empty = fs::is_empty(dir, ec);
  if (ec) return Status::Error(flag + ": cannot list: " + ec.message());
  if (empty) return OkStatus();
  const bool converted = fs::exists(dir / kBankIndexFileName, ec);
  if (!converted)
    return Status::Error(flag + ": not empty and not an earlier conversion (no " +
                         std::string(kBankIndexFileName) + "); choose an empty or new directory");
  if (!overwrite)
    return Status::Error(flag +
                         ": not empty (an earlier conversion); pass --overwrite to replace it, or "
                         "choose an empty or new directory");
  return OkStatus();
}

// A new --out is created under its nearest existing ancestor, which must be a directory.
Status CheckNewOutputParent(const fs::path& out, const std::string& flag) {
  for (fs::path p = out.parent_path(); !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (st.type() == fs::file_type::directory) return OkStatus();
    if (st.type() != fs::file_type::not_found)
      return Status::Error(flag + ": " + p.string() + " is not a directory" +
                           (ec ? " (" + ec.message() + ")" : std::string()) +
                           "; choose another output directory");
    if (p == p.parent_path()) break;
  }
  return Status::Error(flag + ": no existing directory above it; choose another output directory");
}

// --out is neither --model nor inside it, nor (when it is replaced) around it.
Status CheckApartFromModel(const OutputTarget& t, const fs::path& model_dir) {
  std::error_code ec;
  const fs::path model = fs::canonical(model_dir, ec);
  if (ec) return Status::Error(model_dir.string() + ": cannot resolve --model: " + ec.message());
  const std::string flag = OutFlag(t.flag);
  if (t.path == model) return Status::Error(flag + ": --out must differ from --model");
  if (IsWithin(t.path, model))
    return Status::Error(flag + ": inside --model " + model_dir.string() +
                         "; choose an output directory outside the model");
  if (t.exists && IsWithin(model, t.path))
    return Status::Error(flag + ": holds --model " + model_dir.string() +
                         ", which replacing --out would delete; choose another output directory");
  return OkStatus();
}

// fsync of a directory, so the renames in it survive a crash. Best effort: some filesystems
// refuse it, and the files themselves are already synced.
void SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

Expected<std::vector<fs::path>> ListDirectory(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(it->path());
  if (ec) return Status::Error(what + ": cannot list: " + ec.message());
  return entries;
}

Expected<OutputTarget> ResolveOutput(const fs::path& out, const fs::path& model_dir,
                                     bool overwrite) {
  const std::string flag = OutFlag(out);
  if (out.empty()) return Status::Error("--out: empty path; name the output directory");
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(out, ec);
  const fs::file_status st = fs::status(out, ec);
  if (ec && st.type() != fs::file_type::not_found)
    return Status::Error(flag + ": " + ec.message() + "; choose another output directory");
  OutputTarget t;
  t.flag = out;
  if (st.type() == fs::file_type::not_found) {
    if (link.type() == fs::file_type::symlink)
      return Status::Error(flag +
                           ": a symbolic link to a path that does not exist; point it at a "
                           "directory or remove it");
    const fs::path abs = WithoutTrailingSeparator(fs::absolute(out, ec).lexically_normal());
    if (ec) return Status::Error(flag + ": " + ec.message());
    MT_RETURN_IF_ERROR(CheckNewOutputParent(abs, flag));
    t.path = WithoutTrailingSeparator(fs::weakly_canonical(abs, ec));
    if (ec) return Status::Error(flag + ": " + ec.message() + "; choose another output directory");
  } else {
    if (st.type() != fs::file_type::directory)
      return Status::Error(flag +
                           ": exists and is not a directory; choose a new or empty directory");
    t.path = fs::canonical(out, ec);
    if (ec) return Status::Error(flag + ": " + ec.message() + "; choose another output directory");
    MT_RETURN_IF_ERROR(CheckExistingOutput(t.path, flag, overwrite));
    t.exists = true;
  }
  MT_RETURN_IF_ERROR(CheckApartFromModel(t, model_dir));
  return t;
}

StagingDir::~StagingDir() {
  if (published_) return;
  std::error_code ec;
  if (created_) fs::remove_all(path_, ec);
  if (first_created_parent_.empty()) return;
  // Only the empty directories Create made: fs::remove refuses anything else.
  for (fs::path p = out_.path.parent_path(); !p.empty(); p = p.parent_path()) {
    if (!fs::remove(p, ec) || p == first_created_parent_ || p == p.parent_path()) break;
  }
}

Status StagingDir::CreateParents() {
  const fs::path parent = out_.path.parent_path();
  std::error_code ec;
  for (fs::path p = parent; !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    if (fs::exists(p, ec) || ec) break;
    first_created_parent_ = p;
  }
  fs::create_directories(parent, ec);
  if (ec)
    return Status::Error(OutFlag(out_.flag) + ": cannot create " + parent.string() + ": " +
                         ec.message() + "; choose a writable location");
  return OkStatus();
}

Status StagingDir::Create() {
  const std::string pid = std::to_string(::getpid());
  if (out_.exists) {
    path_ = out_.path / (".moetier-convert.tmp-" + pid);
  } else {
    MT_RETURN_IF_ERROR(CreateParents());
    path_ = out_.path.parent_path() / (out_.path.filename().string() + ".tmp-" + pid);
  }
  std::error_code ec;
  created_ = fs::create_directory(path_, ec);
  if (!created_)
    return Status::Error(OutFlag(out_.flag) + ": cannot create " + path_.string() + ": " +
                         (ec ? ec.message() + "; choose a writable location"
                             : std::string("it exists (left by an interrupted run?); remove it")));
  return OkStatus();
}

Status StagingDir::Publish() {
  if (out_.exists) {
    MT_RETURN_IF_ERROR(ReplaceContents());
  } else {
    std::error_code ec;
    fs::rename(path_, out_.path, ec);
    if (ec)
      return Status::Error(OutFlag(out_.flag) + ": cannot rename " + path_.string() +
                           " to it: " + ec.message());
    SyncDirectory(out_.path.parent_path());
  }
  published_ = true;
  return OkStatus();
}

// The earlier conversion's index goes first and the new one last, so an index is never beside
// files it does not describe, even if this stops halfway.
Status StagingDir::ReplaceContents() {
  const std::string flag = OutFlag(out_.flag);
  std::error_code ec;
  const fs::path index = out_.path / kBankIndexFileName;
  fs::remove(index, ec);
  if (ec) return Status::Error(flag + ": cannot remove " + index.string() + ": " + ec.message());
  MT_ASSIGN_OR_RETURN(const std::vector<fs::path> old, ListDirectory(out_.path, flag));
  for (const fs::path& p : old) {
    if (p.filename() == path_.filename()) continue;
    fs::remove_all(p, ec);
    if (ec) return Status::Error(flag + ": cannot remove " + p.string() + ": " + ec.message());
  }
  MT_ASSIGN_OR_RETURN(std::vector<fs::path> staged, ListDirectory(path_, path_.string()));
  std::stable_partition(staged.begin(), staged.end(),
                        [](const fs::path& p) { return p.filename() != kBankIndexFileName; });
  for (const fs::path& p : staged) {
    fs::rename(p, out_.path / p.filename(), ec);
    if (ec)
      return Status::Error(flag + ": cannot move " + p.string() + " into it: " + ec.message());
  }
  fs::remove(path_, ec);
  created_ = false;  // emptied and removed: nothing left to clean up
  SyncDirectory(out_.path);
  return OkStatus();
}

}  // namespace moetier
