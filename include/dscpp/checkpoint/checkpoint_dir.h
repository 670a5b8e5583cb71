// The directory protocol that makes a save atomic. Shards and the manifest are written into a hidden staging
// directory (`save_dir/.<tag>.partial`), which becomes `save_dir/<tag>` by one rename once everything in it is
// fsynced; `save_dir/latest` is replaced the same way afterwards. A crash at any point leaves every earlier tag
// untouched and `latest` naming a complete one; a stale staging directory is removed by the next save of its tag.
// Before a directory's first save publishes anything, `latest` is created empty ("no checkpoint yet"), so a first save
// killed between publishing its tag and naming it leaves a directory that reads as holding no checkpoint, not one
// whose `latest` went missing.
#pragma once

#include <string>
#include <vector>

namespace dscpp {

// Throws CheckpointError unless `tag` can be a directory name here: not empty, no '/', not starting with '.' (so
// not ".."), no control characters, not "latest".
void check_tag(const std::string& tag);

// The tag to load from `dir`: `tag` itself, or what `dir/latest` names when `tag` is empty. Throws CheckpointError
// naming the path when the directory, `latest` or the tag does not exist, the tag is a symbolic link, or `latest`
// names no tag yet (listing the tags that do exist).
std::string resolve_tag(const std::string& dir, const std::string& tag);

// True when `dir` holds no checkpoint: it does not exist, has neither `latest` nor any tag directory (a first save's
// hidden staging directory, left by a crash, does not count), or its `latest` is empty (its first save never
// finished: a tag it published is not committed). Then a job whose first start and restarts share one command line
// (`--save_dir D --load_dir D`) starts fresh. A directory with tags but no `latest` at all is not empty: loading from
// it stays an error that lists the tags, so a damaged directory never restarts a job from zero.
bool holds_no_checkpoint(const std::string& dir);

// The complete tags in `dir` (subdirectories holding a manifest), sorted.
std::vector<std::string> list_tags(const std::string& dir);

std::string staging_dir(const std::string& dir, const std::string& tag);

// Creates `dir` if needed and an empty staging directory for `tag` (removing a stale one).
void prepare_staging(const std::string& dir, const std::string& tag);

// fsyncs the staging directory and renames it to `dir/<tag>`, then fsyncs `dir`. An existing tag of that name is
// replaced by an atomic exchange (renameat2 RENAME_EXCHANGE), so `dir/<tag>` never goes missing.
void publish_staging(const std::string& dir, const std::string& tag);

// Replaces `dir/latest` with `tag` (temporary file, fsync, rename, fsync of `dir`).
void write_latest(const std::string& dir, const std::string& tag);

// Creates an empty `dir/latest` ("no checkpoint yet") when there is none, durably; called before a save publishes.
// A directory whose `latest` went missing but which holds tags is left as it is (loading it stays an error).
void mark_first_save(const std::string& dir);

// Writes `text` to `path` through a temporary file, fsync and rename: `path` is either the old file or the whole
// new one, never a part.
void write_file_durably(const std::string& path, const std::string& text);

// fsync of a directory, so renames inside it survive a power loss.
void fsync_dir(const std::string& dir);

}  // namespace dscpp
