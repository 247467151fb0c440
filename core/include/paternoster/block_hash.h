// Block hashes for automatic prefix caching (after vLLM's automatic prefix
// caching; SGLang's RadixAttention solves the same problem with a radix tree
// over token ids).
//
// Every full block of a request gets a hash chained from its parent's:
//
//   h_0 = hash_block_tokens(root_block_hash(extra_key), tokens[0 .. bs))
//   h_i = hash_block_tokens(h_{i-1},                    tokens[i*bs .. (i+1)*bs))
//
// so equal hashes mean "probably the same whole prefix". The function is
// FNV-1a 64 (Fowler/Noll/Vo) over a fixed little-endian byte encoding (the
// parent hash as 8 bytes, then each token id as 8 bytes), followed by the
// splitmix64 finalizer to spread the bits; it depends on nothing but its
// inputs, so hashes are the same in every process, run and platform.
//
// Collision odds: a 64-bit hash; for N distinct cached blocks the chance that
// any two share a hash is about N^2 / 2^65 (1e-9 for N = 200,000). A collision
// never returns wrong KV: KVCacheManager uses the hash only to find a
// candidate block and then compares the candidate's token ids, its parent
// block and (for a first block) its extra key; a mismatch is a cache miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace paternoster {

using BlockHash = uint64_t;

// FNV-1a 64 offset basis and prime.
inline constexpr uint64_t kFnv64Offset = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnv64Prime = 0x100000001b3ULL;

// Plain FNV-1a 64 over n bytes, continuing from state h.
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv64Offset);

// The "parent" hash of a request's first block: FNV-1a 64 of the tag
// "paternoster-prefix-v1", a 0 byte and the extra key's bytes (e.g. a
// per-request cache_salt; empty for none), finalized with splitmix64.
BlockHash root_block_hash(std::string_view extra_key);

// Hash of a block of n token ids whose parent block hashes to `parent`.
BlockHash hash_block_tokens(BlockHash parent, const int64_t* tokens, int64_t n);

}  // namespace paternoster
