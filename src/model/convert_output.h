// Where `moetier convert` writes (model/convert.cpp's output side, private to it): --out
// resolved and checked before any weight is read, and the staging directory that makes the
// conversion appear as a whole or not at all.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moetier {

// The converted directory, written as a whole or not at all.
struct OutputTarget {
  std::filesystem::path flag;  // --out as given, for messages
  std::filesystem::path path;  // --out absolute, symlinks resolved: where the result goes
  bool exists = false;         // an empty directory, or an earlier conversion --overwrite replaces
};

// Resolves and checks --out without writing anything: a symlink loop, a path through a file, a
// file, a FIFO or a directory holding something else is refused here, before any weight is
// read; so is --out equal to, inside, or (when replaced) around `model_dir`. Whether --out can
// be written is found when the staging directory is created.
Expected<OutputTarget> ResolveOutput(const std::filesystem::path& out,
                                     const std::filesystem::path& model_dir, bool overwrite);

// The entries of `dir`; `what` names it in the error.
Expected<std::vector<std::filesystem::path>> ListDirectory(const std::filesystem::path& dir,
                                                           const std::string& what);

// The directory a conversion is written into until it is complete. A new --out is staged beside
// it (<out>.tmp-<pid> in the same parent), and publishing is one atomic rename. An existing
// --out (empty, or an earlier conversion) is staged inside it, which works too where --out is a
// mount point or its parent is not writable; publishing then replaces its contents, the index
// last. Unless Publish succeeded, the destructor removes the staging directory and the parents
// of a new --out that Create made: whatever ends a conversion (an error, an exception, an
// interruption), --out is left as it was.
class StagingDir {
 public:
  explicit StagingDir(OutputTarget out) : out_(std::move(out)) {}
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;

  // Creates the directory: the first write, so an unwritable --out fails here.
  Status Create();
  const std::filesystem::path& path() const { return path_; }
  // Makes the staged conversion --out.
  Status Publish();

 private:
  Status CreateParents();
  Status ReplaceContents();

  OutputTarget out_;
  std::filesystem::path path_;
  bool created_ = false;
  // The topmost parent of a new --out that Create made, if any.
  std::filesystem::path first_created_parent_;
  bool published_ = false;
};

}  // namespace moetier
