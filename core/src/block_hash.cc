#include "paternoster/block_hash.h"

namespace paternoster {

namespace {

// splitmix64's finalizer (Steele et al., OOPSLA'14): a bijection on 64 bits.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Feeds the 8 little-endian bytes of v into FNV-1a state h.
inline uint64_t fnv1a64_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xffU;
    h *= kFnv64Prime;
  }
  return h;
}

constexpr std::string_view kRootTag{"paternoster-prefix-v1\0", 22};

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnv64Prime;
  }
  return h;
}

BlockHash root_block_hash(std::string_view extra_key) {
  uint64_t h = fnv1a64(kRootTag.data(), kRootTag.size());
  h = fnv1a64(extra_key.data(), extra_key.size(), h);
  return mix64(h);
}

BlockHash hash_block_tokens(BlockHash parent, const int64_t* tokens, int64_t n) {
  uint64_t h = fnv1a64_u64(kFnv64Offset, parent);
  for (int64_t i = 0; i < n; ++i) h = fnv1a64_u64(h, static_cast<uint64_t>(tokens[i]));
  return mix64(h);
}

}  // namespace paternoster
