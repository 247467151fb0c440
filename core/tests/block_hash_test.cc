#include "paternoster/block_hash.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace paternoster {
namespace {

// An independent reference: FNV-1a 64 byte by byte over the documented
// encoding, then splitmix64's finalizer.
uint64_t ref_fnv(const std::vector<unsigned char>& bytes, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ULL;
  return h;
}
uint64_t ref_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
void put_le(std::vector<unsigned char>* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<unsigned char>(v >> (8 * i)));
}
uint64_t ref_block(uint64_t parent, const std::vector<int64_t>& tokens) {
  std::vector<unsigned char> bytes;
  put_le(&bytes, parent);
  for (int64_t t : tokens) put_le(&bytes, static_cast<uint64_t>(t));
  return ref_mix(ref_fnv(bytes));
}

TEST(BlockHash, Fnv1a64PublishedVectors) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
}

TEST(BlockHash, MatchesReferenceImplementation) {
  const std::string tag("paternoster-prefix-v1\0", 22);
  std::vector<unsigned char> tag_bytes(tag.begin(), tag.end());
  EXPECT_EQ(root_block_hash(""), ref_mix(ref_fnv(tag_bytes)));
  std::vector<unsigned char> salted = tag_bytes;
  for (char c : std::string("tenant-a")) salted.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ(root_block_hash("tenant-a"), ref_mix(ref_fnv(salted)));

  const std::vector<int64_t> tokens{7, -1, int64_t{1} << 40, 0, 151643};
  for (uint64_t parent : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0}}) {
    EXPECT_EQ(hash_block_tokens(parent, tokens.data(), 5), ref_block(parent, tokens));
  }
}

// Pinned values (computed once with an independent Python implementation):
// these must never change, or caches shared across processes and runs would
// silently stop hitting.
TEST(BlockHash, StableAcrossRuns) {
  EXPECT_EQ(root_block_hash(""), 0xfd9a16a452153251ULL);
  EXPECT_EQ(root_block_hash("tenant-a"), 0xcdac9099a4bc686bULL);
  const int64_t b0[] = {1, 2, 3, 4};
  const int64_t b1[] = {5, 6, 7, 8};
  const BlockHash h0 = hash_block_tokens(root_block_hash(""), b0, 4);
  EXPECT_EQ(h0, 0x41abdc6754ae4a3dULL);
  EXPECT_EQ(hash_block_tokens(h0, b1, 4), 0x991d3ae6c6391b62ULL);
  const int64_t odd[] = {-1, int64_t{1} << 40};
  EXPECT_EQ(hash_block_tokens(0, odd, 2), 0xbc5ea160deee3c95ULL);
}

TEST(BlockHash, ChainedHashDependsOnParentSaltAndTokens) {
  const int64_t a[] = {1, 2, 3, 4};
  const int64_t b[] = {1, 2, 4, 3};
  const BlockHash r = root_block_hash("");
  EXPECT_NE(hash_block_tokens(r, a, 4), hash_block_tokens(r, b, 4));
  EXPECT_NE(hash_block_tokens(r, a, 4), hash_block_tokens(root_block_hash("salt"), a, 4));
  EXPECT_NE(root_block_hash("x"), root_block_hash("y"));
  // Same block after different parents.
  const BlockHash p1 = hash_block_tokens(r, a, 4);
  const BlockHash p2 = hash_block_tokens(r, b, 4);
  EXPECT_NE(hash_block_tokens(p1, a, 4), hash_block_tokens(p2, a, 4));
  // Length matters (a block of 3 is not a block of 4).
  EXPECT_NE(hash_block_tokens(r, a, 3), hash_block_tokens(r, a, 4));
}

}  // namespace
}  // namespace paternoster
