// The embedded default corpus. Its bytes live in a .cpp generated at build time by embed_corpus.cmake (see
// examples/gpt/CMakeLists.txt) from the license texts in /usr/share/common-licenses.
#pragma once

#include <string_view>

namespace gpt {

// The concatenated texts, as bytes.
std::string_view default_corpus_bytes();
// Which files went in, e.g. "GPL-3, GPL-2, … from /usr/share/common-licenses".
std::string_view default_corpus_sources();

}  // namespace gpt
