// token_dataset: token streams for GPT training, read from text or from llm.c's .bin shards.
//
// Text is tokenized as raw bytes (vocabulary 256), which needs no tokenizer
// files and suits the fortunes corpus that Debian installs. llm.c's GPT-2
// shards hold uint16 ids of the 50257-token GPT-2 vocabulary.
//
//   SWARM_ASSIGN_OR_RETURN(swarm::TokenDataset corpus,
//                          swarm::load_text_bytes(swarm::kDefaultCorpus));
//   SWARM_ASSIGN_OR_RETURN(swarm::TokenDataset shard, swarm::load_gpt2_bin("train_000001.bin"));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm {

// Debian's `fortunes` package: about 2.5 MB of English text in a few dozen files.
inline constexpr char kDefaultCorpus[] = "/usr/share/games/fortunes";

inline constexpr int kByteVocabSize = 256;
inline constexpr int kGpt2VocabSize = 50257;
inline constexpr int32_t kGpt2BinMagic = 20240520;
inline constexpr int32_t kGpt2BinVersion = 1;
inline constexpr int kGpt2BinHeaderInts = 256;

struct TokenDataset {
  std::vector<int32_t> tokens;  // every id is in [0, vocab_size)
  int vocab_size = 0;
  std::string source;  // the path it came from, for messages and logs
};

// The bytes of a text file as tokens. A directory is read file by file in
// sorted name order, skipping the `.dat` index files and `.u8` links that the
// fortunes package ships next to each text, symlinks to files already read,
// subdirectories (such as fortunes' offensive `off/`) and anything not a file.
// Errors: not_found, permission_denied, invalid_argument when there is no text.
Result<TokenDataset> load_text_bytes(const std::string& path);

// llm.c's token shard: 256 little-endian int32 (magic 20240520, version 1,
// token count, unused), then `count` little-endian uint16 GPT-2 token ids.
// Errors: not_found, invalid_argument (empty, wrong magic, bad count, id past
// the vocabulary, bytes past the tokens), unimplemented (another version),
// data_loss (fewer bytes than the header promises).
Result<TokenDataset> load_gpt2_bin(const std::string& path);

}  // namespace swarm
