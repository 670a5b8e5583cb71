// Checkpoint directories: staging, publishing by rename, and `latest`.
#include "dscpp/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dscpp/checkpoint/manifest.h"

namespace fs = std::filesystem;

namespace dscpp {
namespace {

std::string joined(const std::vector<std::string>& items) {
  if (items.empty()) return "none";
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed: " + std::strerror(err));
}

}  // namespace

void check_tag(const std::string& tag) {
  // No '/' and no leading '.' (so no ".."): a tag from the command line or a `latest` file names a directory inside
  // the checkpoint directory, never one elsewhere; no control characters, which would break `latest`'s one line.
  const bool control =
      std::any_of(tag.begin(), tag.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)) != 0; });
  if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.' || tag == kLatestFile || control) {
    std::string shown = tag;  // a NUL would end the message where it stands
    for (char& c : shown) if (std::iscntrl(static_cast<unsigned char>(c)) != 0) c = '?';
    throw CheckpointError("checkpoint tag '" + shown + "' is not allowed: it must be a plain directory name (no '/', "
                          "not starting with '.', no control characters, not \"latest\")");
  }
}

std::vector<std::string> list_tags(const std::string& dir) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (!name.empty() && name[0] != '.' && fs::exists(entry.path() / kManifestFile)) tags.push_back(name);
  }
  std::sort(tags.begin(), tags.end());
  return tags;
}

std::string resolve_tag(const std::string& dir, const std::string& tag) {
  if (!fs::is_directory(dir)) throw CheckpointError(dir + ": no such checkpoint directory");
  std::string resolved = tag;
  if (resolved.empty()) {
    const auto latest = (fs::path(dir) / kLatestFile).string();
    std::ifstream in(latest);
    if (!in) {
      throw CheckpointError(latest + ": missing, so there is no latest checkpoint to load; pass a tag (complete "
                            "tags here: " + joined(list_tags(dir)) + ")");
    }
    std::getline(in, resolved);
    while (!resolved.empty() && std::isspace(static_cast<unsigned char>(resolved.back()))) resolved.pop_back();
    if (resolved.empty()) {
      throw CheckpointError(latest + ": names no tag yet (the first save into this directory did not finish); pass "
                            "a tag (complete tags here: " + joined(list_tags(dir)) + ")");
    }
  }
  check_tag(resolved);
  // A tag that is a symbolic link could lead a load anywhere on the machine: tags are directories, not links.
  if (fs::is_symlink(fs::path(dir) / resolved)) {
    throw CheckpointError((fs::path(dir) / resolved).string() + ": tag '" + resolved + "' is a symbolic link; a "
                          "checkpoint's tags must be directories inside it");
  }
  if (!fs::is_directory(fs::path(dir) / resolved)) {
    throw CheckpointError((fs::path(dir) / resolved).string() + ": tag '" + resolved + "' does not exist (complete "
                          "tags here: " + joined(list_tags(dir)) + ")");
  }
  return resolved;
}

bool holds_no_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return true;
  if (!fs::is_directory(dir, ec)) return false;  // a file there: loading says what is wrong
  const auto latest = fs::path(dir) / kLatestFile;
  if (fs::exists(latest, ec)) {
    std::ifstream in(latest);
    std::string text;
    in >> text;  // skips whitespace: empty when `latest` names nothing yet
    return in.eof() && text.empty();
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (!name.empty() && name[0] != '.' && entry.is_directory(ec)) return false;
  }
  return !ec;
}

std::string staging_dir(const std::string& dir, const std::string& tag) {
  return (fs::path(dir) / ("." + tag + ".partial")).string();
}

void prepare_staging(const std::string& dir, const std::string& tag) {
  check_tag(tag);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(dir + ": cannot create the checkpoint directory: " + ec.message());
  const auto staging = staging_dir(dir, tag);
  fs::remove_all(staging, ec);  // a save of this tag that died earlier
  if (ec) throw CheckpointError(staging + ": cannot remove a stale staging directory: " + ec.message());
  fs::create_directory(staging, ec);
  if (ec) throw CheckpointError(staging + ": cannot create: " + ec.message());
}

void publish_staging(const std::string& dir, const std::string& tag) {
  const auto staging = staging_dir(dir, tag);
  fsync_dir(staging);
  const auto final_path = (fs::path(dir) / tag).string();
  if (fs::exists(final_path)) {
    // Re-saving a tag: swap the two directories in one step, so `<tag>` is the old or the new checkpoint at every
    // instant, never missing; the old one then sits under the staging name, where the next save of this tag would
    // remove it anyway.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) != 0) {
      throw CheckpointError(final_path + ": cannot swap in the finished checkpoint: " + std::strerror(errno));
    }
    fsync_dir(dir);
    std::error_code ec;
    fs::remove_all(staging, ec);
    return;
  }
  if (std::rename(staging.c_str(), final_path.c_str()) != 0) {
    throw CheckpointError(final_path + ": cannot move the finished checkpoint into place: " + std::strerror(errno));
  }
  fsync_dir(dir);
}

void write_file_durably(const std::string& path, const std::string& text) {
  const auto temp = path + ".tmp." + std::to_string(::getpid());
  ::unlink(temp.c_str());  // a stale one of ours; a link planted there is removed, never written through
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(temp + ": cannot create: " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(temp.c_str());
    throw CheckpointError(temp + ": cannot write: " + std::strerror(err));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(temp.c_str());
    throw CheckpointError(path + ": cannot replace: " + std::strerror(rename_err));
  }
}

void write_latest(const std::string& dir, const std::string& tag) {
  write_file_durably((fs::path(dir) / kLatestFile).string(), tag + "\n");
  fsync_dir(dir);
}

void mark_first_save(const std::string& dir) {
  const auto latest = (fs::path(dir) / kLatestFile).string();
  std::error_code ec;
  if (fs::exists(latest, ec) || !list_tags(dir).empty()) return;
  write_file_durably(latest, "");
  fsync_dir(dir);
}

void fsync_dir(const std::string& dir) { fsync_path(dir, O_RDONLY | O_DIRECTORY); }

}  // namespace dscpp
