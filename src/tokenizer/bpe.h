// Rank-BPE of one pre-tokenized piece, as tiktoken's core does it.
#pragma once
#include <string_view>
#include <vector>

#include "tokenizer/rank_table.h"

namespace wren {

/// Appends the token ids of `piece` (non-empty bytes) to `out`: if the whole piece is a
/// vocabulary entry, its rank; otherwise start from single bytes and repeatedly merge the
/// adjacent pair whose concatenation has the lowest rank (the leftmost such pair on ties) until
/// no adjacent pair is in the vocabulary. Short pieces use a linear scan per merge (O(n^2), as
/// tiktoken); long ones a heap with lazy invalidation (O(n log n)); both give identical
/// results. Every single byte must have a rank (load_tiktoken_model guarantees it).
/// Source: docs/model.md#tokenizer.
void bpe_encode(const RankTable& ranks, std::string_view piece, std::vector<int>& out);

/// The same merge computed only by the O(n^2) scan or only by the heap (for tests).
void bpe_encode_scan(const RankTable& ranks, std::string_view piece, std::vector<int>& out);
void bpe_encode_heap(const RankTable& ranks, std::string_view piece, std::vector<int>& out);

}  // namespace wren
