// TokenDataset::default_corpus: the embedded corpus as a dataset. Apart from token_dataset.cpp so that the file
// parsers there build (for the fuzz target) without the generated corpus bytes.
#include <string>

#include "data/default_corpus.h"
#include "data/token_dataset.h"

namespace gpt {

TokenDataset TokenDataset::default_corpus() {
  const auto bytes = default_corpus_bytes();
  return from_text(bytes, "embedded default corpus (" + std::string(default_corpus_sources()) + ", " +
                              std::to_string(bytes.size()) + " bytes)");
}

}  // namespace gpt
