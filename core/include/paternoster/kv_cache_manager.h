// KVCacheManager: per-request block tables over a BlockPool (PagedAttention,
// Kwon et al., SOSP'23), with optional automatic prefix caching (after vLLM's
// automatic prefix caching; SGLang's RadixAttention is the radix-tree
// alternative).
//
// A request's block table lists the KV blocks holding its tokens in order:
// token at position p lives in block table[p / block_size], slot
// p % block_size. Tables only grow (allocate_slots) until the request is freed.
// Request ids are int64 chosen by the caller. Not thread safe.
//
// Prefix caching (enable_caching): once a full block's KV is computed the
// owner calls cache_blocks() and the block is registered under its chained
// hash (block_hash.h). A new request calls get_computed_blocks() first: the
// longest cached prefix, in whole blocks, becomes the start of its table
// (shared, ref-counted), and the request computes only the rest. Freed cached
// blocks stay reusable until the pool evicts them (LRU; see block_pool.h).
//
// Hits are exact: the hash only finds a candidate block; the candidate must
// also hold the same token ids, follow the same parent block (by id and
// generation, so a parent that was evicted and reused no longer matches) and,
// for a first block, carry the same cache salt. A collision is a miss.
//
// KV cache groups (vLLM's hybrid KV cache manager): a model whose layers do
// not all attend the same way (Gemma 3: five sliding-window layers per global
// one; gpt-oss: alternating) gets one group per kind of layer (the host may
// split a kind into several equal-sized groups so that groups can share the
// same physical cache tensors). Every group gives each request its own block
// table over the one shared pool; a token's block index is the same in every
// group (position / block_size). A full-attention group keeps every block. A
// sliding-window group of window W (a query at position p sees p - W < k <= p)
// frees a block once every position in it is out of reach of the next token to
// compute: allocate_slots(req, n, num_computed) releases the blocks wholly below
// num_computed - W + 1 and writes kNoBlock in their table entries, so a long
// request holds about W / block_size + its chunk's blocks in that group. The
// paged-attention kernels never read those entries. Admission, can_allocate,
// usage and preemption (free) count the blocks of every group.
//
// Prefix caching with groups: each group's blocks are cached under hashes
// rooted at the group (a group never hits another's blocks); a request's hit is
// the shortest of its groups' hits, and a sliding group hits only through an
// unbroken chain from the first block (its blocks freed out of the window stay
// cached until the pool evicts them), which is conservative: a miss costs
// recomputation, never a wrong block.
//
// Recurrent-state groups (linear attention / Mamba-style layers: Gated
// DeltaNet in Qwen3-Next and Qwen3.5): such layers keep a fixed-size state per
// request (a convolution window and an SSM state) instead of per-token KV. A
// recurrent group gives each request exactly one *state slot*, an index into
// the host's per-layer state tensors, from a pool of num_state_slots slots
// separate from the block pool (its entries are slots, not blocks). The slot
// is taken by the request's first allocate_slots, kept however many tokens
// follow, and returned by free() (finish or preemption; a preempted request
// recomputes from its first token, so its state starts over). Admission
// (can_allocate / allocate_slots) needs a free slot per recurrent group the
// request has none in. Prefix caching cannot be combined with recurrent groups
// (a hit would skip tokens whose state was never saved): the constructor
// refuses it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "paternoster/block_hash.h"
#include "paternoster/block_pool.h"

namespace paternoster {

// The table entry of a block a sliding-window group has released.
constexpr int32_t kNoBlock = -1;

// One KV cache group: the layers sharing a block table.
struct KVCacheGroupSpec {
  // 0: full attention. W > 0: sliding-window attention over the last W
  // positions (the query's own included).
  int64_t sliding_window = 0;
  // A recurrent-state group: one state slot per request instead of blocks
  // (sliding_window must then be 0).
  bool recurrent = false;
};

class KVCacheManager {
 public:
  // num_blocks >= 0, block_size >= 1, at least one group and every
  // sliding_window >= 0, else std::invalid_argument. With enable_caching =
  // false the manager behaves as before prefix caching: get_computed_blocks()
  // finds nothing, cache_blocks() does nothing, and free() returns blocks in
  // table order. The default is one full-attention group. num_state_slots:
  // the recurrent groups' slot pool, >= 1 when a group is recurrent (>= 0
  // otherwise); std::invalid_argument also for a recurrent group with a
  // window, or with enable_caching.
  KVCacheManager(int64_t num_blocks, int64_t block_size, bool enable_caching = false,
                 std::vector<KVCacheGroupSpec> groups = {KVCacheGroupSpec{}},
                 int64_t num_state_slots = 0);

  int64_t num_groups() const { return static_cast<int64_t>(groups_.size()); }
  // std::invalid_argument if g is out of range.
  const KVCacheGroupSpec& group(int64_t g) const;

  // Blocks the request needs beyond those it holds now to have KV slots for
  // its first `num_tokens` tokens, once it has computed `num_computed_tokens`
  // of them (sliding-window groups release what falls out of the window
  // first, so this is the net growth over all groups, at least 0). With
  // num_computed_tokens = 0 nothing is released: the whole prompt's blocks.
  // A planner may pass a future num_computed_tokens (e.g. the start of a
  // request's last prefill chunk) to get that step's peak. An unknown request
  // holds nothing. std::invalid_argument: num_tokens < 0 or
  // num_computed_tokens < 0.
  int64_t num_required_blocks(int64_t req_id, int64_t num_tokens,
                              int64_t num_computed_tokens = 0) const;
  // KV blocks and, for a request without its state slots yet, a free slot
  // per recurrent group.
  bool can_allocate(int64_t req_id, int64_t num_tokens, int64_t num_computed_tokens = 0) const;
  // State slots the request would take (recurrent groups it holds none in).
  int64_t num_required_state_slots(int64_t req_id) const;

  // Grows the request's tables to cover its first `num_tokens` tokens, all or
  // nothing: returns false (and changes nothing) when too few blocks (or state
  // slots) are free. A recurrent group's table is its one state slot.
  // Sliding-window groups first release the blocks wholly below
  // num_computed_tokens - W + 1 (their entries become kNoBlock); the caller
  // passes the request's true computed count, which must not decrease while
  // the request lives. Creates the tables if the request is new (also when
  // no block is needed).
  bool allocate_slots(int64_t req_id, int64_t num_tokens, int64_t num_computed_tokens = 0);

  // Returns all the request's blocks (every group) to the pool and forgets
  // it; no-op for an unknown request. With caching on the blocks are released
  // last block first, so among one request's cached blocks the tail is
  // evicted first.
  void free(int64_t req_id);

  // Blocks the request holds in all groups (released entries and state slots
  // not counted); 0 for an unknown request.
  int64_t num_request_blocks(int64_t req_id) const;

  // ---- prefix caching

  // Looks up the longest cached prefix of tokens[0 .. n) in whole blocks,
  // leaving at least the last token uncomputed (at most (n - 1) / block_size
  // blocks), for a request that has no table yet. The hit blocks get one more
  // reference each (so they cannot be evicted) and become the request's table;
  // the request's salt and hashes are kept for cache_blocks(). Counts n
  // queried tokens and the hit tokens. Returns the number of computed tokens
  // (hit blocks * block_size); 0 and no change with caching off.
  // std::invalid_argument: n < 0, or the request already has a table.
  int64_t get_computed_blocks(int64_t req_id, const int64_t* tokens, int64_t n,
                              std::string_view cache_salt = {});
  int64_t get_computed_blocks(int64_t req_id, const std::vector<int64_t>& tokens,
                              std::string_view cache_salt = {}) {
    return get_computed_blocks(req_id, tokens.data(), static_cast<int64_t>(tokens.size()),
                               cache_salt);
  }

  // The tokens get_computed_blocks(tokens, n, cache_salt) would find cached
  // now, without taking them: no reference, no table, no counters (a
  // planner's estimate for a request not yet admitted; the blocks may be
  // evicted before it is). 0 with caching off. std::invalid_argument: n < 0.
  int64_t num_cached_prefix_tokens(const int64_t* tokens, int64_t n,
                                   std::string_view cache_salt = {}) const;

  // Registers the request's full blocks among its first `num_tokens` tokens
  // (tokens[0 .. num_tokens), whose KV must already be written) in the prefix
  // cache. Incremental: blocks handled by an earlier call (or hit by
  // get_computed_blocks) are skipped, so the cost is per new full block. A
  // block whose content is already cached under another block id stays
  // uncached (the request keeps its own copy); the first block that cannot be
  // linked (a hash collision, or a parent evicted meanwhile) ends caching for
  // this request. A request never passed to get_computed_blocks uses no salt.
  // A block holding a token id outside int32 is not cached (nor anything
  // after it). No-op with caching off. std::invalid_argument: unknown request,
  // num_tokens < 0, or its table covers fewer than num_tokens / block_size
  // blocks.
  void cache_blocks(int64_t req_id, const int64_t* tokens, int64_t num_tokens);
  void cache_blocks(int64_t req_id, const std::vector<int64_t>& tokens) {
    cache_blocks(req_id, tokens.data(), static_cast<int64_t>(tokens.size()));
  }
  // Whether cache_blocks(req_id, ..., num_tokens) has any block to consider
  // (false when caching is off, the request stopped caching, or no block
  // became full since the last call): one hash lookup, for per-step loops.
  bool has_blocks_to_cache(int64_t req_id, int64_t num_tokens) const;

  // Forgets every cached block (in use or free; running requests keep their
  // blocks but cache nothing more). Returns the number of blocks uncached (0
  // with caching off). The counters are not reset.
  int64_t reset_prefix_cache();

  bool enable_caching() const { return pool_.enable_caching(); }
  // Tokens passed to get_computed_blocks, and how many of them hit (tokens).
  int64_t prefix_cache_queries() const { return queries_; }
  int64_t prefix_cache_hits() const { return hits_; }
  int64_t num_cached_blocks() const { return pool_.num_cached_blocks(); }

  // Test hook: every block hash is and-ed with `mask` (0 makes all blocks
  // collide) to exercise the collision checks. Default: all ones.
  void set_hash_mask_for_testing(uint64_t mask) { hash_mask_ = mask; }
  // Test hook: compute block hashes with `fn` instead of hash_block_tokens
  // (nullptr restores it), e.g. a hash that ignores the parent.
  using HashFn = BlockHash (*)(BlockHash parent, const int64_t* tokens, int64_t n);
  void set_hash_fn_for_testing(HashFn fn) { hash_fn_ = fn; }

  // The request's block table in `group` (a copy; released entries are
  // kNoBlock); std::invalid_argument if the request or group is unknown.
  std::vector<int32_t> block_table(int64_t req_id, int64_t group = 0) const;
  // The request's block table in `group`, or nullptr if the request is
  // unknown (std::invalid_argument for a bad group). Valid until the next call
  // that modifies this request.
  const std::vector<int32_t>* find_block_table(int64_t req_id, int64_t group = 0) const;

  bool has_request(int64_t req_id) const { return tables_.count(req_id) != 0; }
  int64_t num_requests() const { return static_cast<int64_t>(tables_.size()); }
  int64_t num_free_blocks() const { return pool_.num_free_blocks(); }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  int64_t block_size() const { return block_size_; }
  // Fraction of blocks in use, in [0, 1].
  double usage() const { return pool_.usage(); }
  // The recurrent groups' state slots: all, free, and the fraction in use (0
  // without recurrent groups).
  int64_t num_state_slots() const { return num_state_slots_; }
  int64_t num_free_state_slots() const {
    return static_cast<int64_t>(free_state_slots_.size());
  }
  double state_usage() const {
    return num_state_slots_ == 0
               ? 0.0
               : 1.0 - static_cast<double>(free_state_slots_.size()) /
                           static_cast<double>(num_state_slots_);
  }
  int64_t num_recurrent_groups() const { return num_recurrent_groups_; }

  const BlockPool& pool() const { return pool_; }

 private:
  // A block in the chain being walked: its id and generation.
  struct BlockRef {
    int32_t id = -1;  // -1: the chain's root (no parent)
    uint64_t gen = 0;
  };
  // Per-request caching state.
  struct RequestCache {
    std::string salt;
    std::vector<BlockHash> hashes;  // hashes[i]: chained hash of block i
    int64_t num_linked = 0;         // blocks 0 .. num_linked-1 are in the cache
    BlockRef last;                  // the cached block holding block num_linked-1
    bool stopped = false;           // a block could not be linked: cache no more
  };

  using Tables = std::vector<std::vector<int32_t>>;  // one table per group

  int64_t blocks_for(int64_t num_tokens) const;
  // First block index group g still needs once num_computed tokens are done.
  int64_t first_needed_block(int64_t g, int64_t num_computed) const;
  void check_group(int64_t g) const;
  BlockHash block_hash_at(RequestCache& st, int64_t g, int64_t i, const int64_t* tokens);
  // What cached_prefix_blocks() found: per group, the matched block ids and
  // the hashes it computed (through the first miss).
  struct PrefixWalk {
    Tables found;
    std::vector<std::vector<BlockHash>> hashes;
  };
  // The longest prefix of tokens[0 .. n) cached in every group, in whole
  // blocks, leaving the last token uncomputed; changes nothing. With `out`,
  // what each group's walk found (for get_computed_blocks to take).
  int64_t cached_prefix_blocks(const int64_t* tokens, int64_t n, std::string_view salt,
                               PrefixWalk* out) const;
  // The hash of the block `block` after the block hashed `parent`; the first
  // block's parent is chain_root(salt, g).
  BlockHash chain_hash(BlockHash parent, const int64_t* block) const;
  BlockHash chain_root(std::string_view salt, int64_t g) const;
  // The cached block of group g holding `hash` whose content is exactly
  // (parent, tokens, salt), if any.
  std::optional<int32_t> match(int64_t g, BlockHash hash, BlockRef parent,
                               const int64_t* tokens, std::string_view salt) const;
  void record(int64_t g, int32_t id, BlockRef parent, const int64_t* tokens,
              std::string_view salt);
  void cache_group(RequestCache& st, int64_t g, const std::vector<int32_t>& table,
                   const int64_t* tokens, int64_t full);

  BlockPool pool_;
  int64_t block_size_;
  std::vector<KVCacheGroupSpec> groups_;
  std::unordered_map<int64_t, Tables> tables_;
  int64_t num_state_slots_ = 0;
  int64_t num_recurrent_groups_ = 0;
  std::vector<int32_t> free_state_slots_;  // taken from the back

  // Prefix cache (sized only with caching on): per block, its parent and, for
  // a first block, the salt; its tokens at [id * block_size, +block_size), as
  // int32 (4 bytes x block_size per block: 64 MiB for 1M blocks of 16).
  std::unordered_map<int64_t, std::vector<RequestCache>> req_cache_;  // one per group
  std::vector<BlockRef> parent_;
  std::vector<int32_t> block_group_;  // the group whose chain a cached block is in
  std::vector<std::string> root_salt_;
  std::vector<int32_t> block_tokens_;
  uint64_t hash_mask_ = ~uint64_t{0};
  HashFn hash_fn_ = nullptr;
  int64_t queries_ = 0;
  int64_t hits_ = 0;
};

}  // namespace paternoster
