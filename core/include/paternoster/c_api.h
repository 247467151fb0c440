/* C API of the Paternoster core: the block pool, the KV cache manager and the
 * batch builder for hosts in other languages (C, Rust, Go, Zig, ... through
 * their C FFI). Pure C99; the C++ classes behind it are block_pool.h,
 * kv_cache_manager.h and batch_builder.h, whose comments hold the algorithms.
 *
 * Conventions, for every function below unless it says otherwise:
 *   - It returns a pn_status_t. PN_OK is 0; anything else is an error and then
 *     nothing changed (all or nothing) and no output was written, except where
 *     the function says what it writes on error. pn_last_error_message() gives
 *     the reason as text.
 *   - No C++ exception crosses this boundary: every one is caught and turned
 *     into a status (std::bad_alloc into PN_ERR_OUT_OF_MEMORY, anything
 *     unexpected into PN_ERR_INTERNAL).
 *   - Handles are opaque pointers created by a *_create function, which the
 *     caller owns and releases with the matching *_destroy (NULL is a no-op).
 *     A NULL handle or a NULL output pointer is PN_ERR_INVALID_ARGUMENT.
 *   - Arrays are (pointer, count) pairs; a negative count is
 *     PN_ERR_INVALID_ARGUMENT, and the pointer may be NULL only when the count
 *     is 0. Input arrays are read during the call only (never kept).
 *   - Units: token counts and positions are in tokens; block counts in blocks
 *     (a block holds block_size tokens); block ids are int32 in
 *     [0, num_blocks); slots are block_id * block_size + offset. Request ids
 *     are any int64 the caller chooses.
 *   - No handle is thread safe. Distinct handles can be used from distinct
 *     threads at once, except that a batch builder reads its KV cache
 *     manager: treat the two as one object.
 */
#ifndef PATERNOSTER_C_API_H_
#define PATERNOSTER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define PN_NOEXCEPT noexcept
extern "C" {
#else
#define PN_NOEXCEPT
#endif

/* ------------------------------------------------------------------ version */

/* The version of this header. The installed CMake package carries the same
 * version (paternoster_core_VERSION). */
#define PN_VERSION_MAJOR 0
#define PN_VERSION_MINOR 1
#define PN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, e.g. 100 for 0.1.0. */
#define PN_VERSION (PN_VERSION_MAJOR * 10000 + PN_VERSION_MINOR * 100 + PN_VERSION_PATCH)

/* The version of the linked library, encoded as PN_VERSION. A host loading the
 * library at run time can compare it with the PN_VERSION it was built with.
 * Cannot fail. */
uint32_t pn_version(void) PN_NOEXCEPT;

/* ------------------------------------------------------------------- status */

typedef enum pn_status {
  PN_OK = 0,
  /* A NULL handle or pointer, a negative count or size, or arguments the call
   * rejects (a bad schedule, a double free, a block id out of range). */
  PN_ERR_INVALID_ARGUMENT = 1,
  /* Too few free KV blocks; nothing was allocated. */
  PN_ERR_OUT_OF_BLOCKS = 2,
  /* The request id is not registered with this manager or builder. */
  PN_ERR_NOT_FOUND = 3,
  /* The request id is registered already. */
  PN_ERR_ALREADY_EXISTS = 4,
  /* A caller-provided output array is too small; the needed length was
   * written to the length output. */
  PN_ERR_BUFFER_TOO_SMALL = 5,
  /* Memory allocation failed. */
  PN_ERR_OUT_OF_MEMORY = 6,
  /* An unexpected error inside the library (a bug: please report it). */
  PN_ERR_INTERNAL = 7
} pn_status_t;

/* The enumerator's name, e.g. "PN_ERR_NOT_FOUND"; "PN_ERR_UNKNOWN" for a
 * value outside the enum. A static string; cannot fail. */
const char* pn_status_string(pn_status_t status) PN_NOEXCEPT;

/* Text of the error reported by the latest call made on this thread
 * ("function: reason"), or "" if that call returned PN_OK. Thread-local; the
 * string stays valid until this thread's next call into this API. Cannot
 * fail. */
const char* pn_last_error_message(void) PN_NOEXCEPT;

/* --------------------------------------------------------------- block pool */

/* A standalone pool of reference-counted KV blocks (no prefix caching), for
 * hosts that keep their own block tables. The KV cache manager below has its
 * own pool; this one is independent of it. */
typedef struct pn_block_pool pn_block_pool_t;

/* Creates a pool of num_blocks free blocks (ids 0 .. num_blocks - 1) into
 * *out. num_blocks must be in [0, 2^31 - 1), else PN_ERR_INVALID_ARGUMENT. */
pn_status_t pn_block_pool_create(int64_t num_blocks, pn_block_pool_t** out) PN_NOEXCEPT;

/* Destroys the pool (NULL: no-op). Blocks still in use are simply dropped. */
pn_status_t pn_block_pool_destroy(pn_block_pool_t* pool) PN_NOEXCEPT;

/* Takes n free blocks (reference count 1 each) and writes their ids to
 * out_ids[0 .. n), which the caller provides. All or nothing:
 * PN_ERR_OUT_OF_BLOCKS when fewer than n blocks are free. */
pn_status_t pn_block_pool_allocate(pn_block_pool_t* pool, int64_t n,
                                   int32_t* out_ids) PN_NOEXCEPT;

/* Drops one reference to each of ids[0 .. n) (an id may be listed once per
 * reference); blocks reaching zero become free. PN_ERR_INVALID_ARGUMENT for an
 * id out of range or a block without a reference left (double free); then no
 * reference count changes. */
pn_status_t pn_block_pool_free(pn_block_pool_t* pool, const int32_t* ids,
                               int64_t n) PN_NOEXCEPT;

/* Adds one reference to each of ids[0 .. n) (to share blocks). Every block
 * must be in use, else PN_ERR_INVALID_ARGUMENT and no change. */
pn_status_t pn_block_pool_incr_ref(pn_block_pool_t* pool, const int32_t* ids,
                                   int64_t n) PN_NOEXCEPT;

/* Writes block `id`'s reference count (0 = free) to *out.
 * PN_ERR_INVALID_ARGUMENT if id is out of range. */
pn_status_t pn_block_pool_ref_count(const pn_block_pool_t* pool, int32_t id,
                                    int32_t* out) PN_NOEXCEPT;

/* Write the pool's total and free block counts (blocks) to *out. */
pn_status_t pn_block_pool_num_blocks(const pn_block_pool_t* pool, int64_t* out) PN_NOEXCEPT;
pn_status_t pn_block_pool_num_free_blocks(const pn_block_pool_t* pool,
                                          int64_t* out) PN_NOEXCEPT;

/* ------------------------------------------------------- KV cache manager */

/* Per-request block tables over a block pool (PagedAttention), with optional
 * automatic prefix caching. A request's table lists the blocks holding its
 * tokens in order: position p lives in block table[p / block_size], offset
 * p % block_size. Tables only grow until the request is freed. */
typedef struct pn_kv_cache_manager pn_kv_cache_manager_t;

/* Creates a manager over num_blocks blocks of block_size tokens into *out.
 * enable_caching: nonzero turns on automatic prefix caching (see
 * pn_kv_cache_manager_get_computed_blocks). PN_ERR_INVALID_ARGUMENT unless
 * num_blocks is in [0, 2^31 - 1) and block_size >= 1. */
pn_status_t pn_kv_cache_manager_create(int64_t num_blocks, int64_t block_size,
                                       int enable_caching,
                                       pn_kv_cache_manager_t** out) PN_NOEXCEPT;

/* Like pn_kv_cache_manager_create, with num_groups KV cache groups (the
 * layers sharing one set of block tables; see kv_cache_manager.h):
 * sliding_windows[g] is group g's attention window in tokens, 0 for full
 * attention. A sliding-window group releases the blocks that fall out of the
 * window (pn_kv_cache_manager_allocate_slots_after). PN_ERR_INVALID_ARGUMENT
 * as pn_kv_cache_manager_create, or unless num_groups >= 1 and every window
 * >= 0. */
pn_status_t pn_kv_cache_manager_create_grouped(int64_t num_blocks, int64_t block_size,
                                               int enable_caching,
                                               const int64_t* sliding_windows,
                                               int64_t num_groups,
                                               pn_kv_cache_manager_t** out) PN_NOEXCEPT;

/* Like pn_kv_cache_manager_create_grouped, where recurrent[g] nonzero makes
 * group g a recurrent-state group (linear-attention / Mamba-style layers; its
 * window must be 0): each request holds one state slot there, taken by its
 * first allocation from a pool of num_state_slots slots and returned when it is
 * freed; its block table is that one slot. PN_ERR_INVALID_ARGUMENT as
 * pn_kv_cache_manager_create_grouped, or with a recurrent group and
 * num_state_slots < 1 or enable_caching (prefix caching cannot skip tokens
 * whose state was never saved). */
pn_status_t pn_kv_cache_manager_create_hybrid(int64_t num_blocks, int64_t block_size,
                                              int enable_caching,
                                              const int64_t* sliding_windows,
                                              const int* recurrent, int64_t num_groups,
                                              int64_t num_state_slots,
                                              pn_kv_cache_manager_t** out) PN_NOEXCEPT;

/* Writes the number of free recurrent state slots (0 without recurrent groups). */
pn_status_t pn_kv_cache_manager_num_free_state_slots(const pn_kv_cache_manager_t* manager,
                                                     int64_t* out) PN_NOEXCEPT;

/* Writes the number of KV cache groups (1 unless created grouped). */
pn_status_t pn_kv_cache_manager_num_groups(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) PN_NOEXCEPT;

/* The _after variants of num_required_blocks / can_allocate / allocate_slots
 * take the request's computed token count: sliding-window groups first
 * release the blocks wholly below num_computed_tokens - window + 1 (their
 * table entries become -1), and the count is net of what they release. The
 * plain variants are these with num_computed_tokens = 0 (nothing released).
 * PN_ERR_INVALID_ARGUMENT: num_tokens < 0 or num_computed_tokens < 0. */
pn_status_t pn_kv_cache_manager_num_required_blocks_after(const pn_kv_cache_manager_t* manager,
                                                          int64_t req_id, int64_t num_tokens,
                                                          int64_t num_computed_tokens,
                                                          int64_t* out_blocks) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_can_allocate_after(const pn_kv_cache_manager_t* manager,
                                                   int64_t req_id, int64_t num_tokens,
                                                   int64_t num_computed_tokens,
                                                   int* out) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_allocate_slots_after(pn_kv_cache_manager_t* manager,
                                                     int64_t req_id, int64_t num_tokens,
                                                     int64_t num_computed_tokens) PN_NOEXCEPT;

/* pn_kv_cache_manager_block_table for KV cache group `group` (released
 * entries are -1). PN_ERR_INVALID_ARGUMENT: group out of range. */
pn_status_t pn_kv_cache_manager_group_block_table(const pn_kv_cache_manager_t* manager,
                                                  int64_t req_id, int64_t group,
                                                  int32_t* out_ids, int64_t capacity,
                                                  int64_t* out_len) PN_NOEXCEPT;

/* Releases the caller's handle (NULL: no-op). Batch builders created on the
 * manager keep it alive: its memory goes when the last of them is destroyed
 * too, so the handles can be destroyed in any order. */
pn_status_t pn_kv_cache_manager_destroy(pn_kv_cache_manager_t* manager) PN_NOEXCEPT;

/* Writes to *out_blocks how many blocks request req_id must add so that its
 * first num_tokens tokens have KV slots: max(0, ceil(num_tokens / block_size)
 * - table size). An unknown request counts as an empty table.
 * PN_ERR_INVALID_ARGUMENT: num_tokens < 0. */
pn_status_t pn_kv_cache_manager_num_required_blocks(const pn_kv_cache_manager_t* manager,
                                                    int64_t req_id, int64_t num_tokens,
                                                    int64_t* out_blocks) PN_NOEXCEPT;

/* Writes 1 to *out if pn_kv_cache_manager_allocate_slots(manager, req_id,
 * num_tokens) would succeed now, else 0. PN_ERR_INVALID_ARGUMENT:
 * num_tokens < 0. */
pn_status_t pn_kv_cache_manager_can_allocate(const pn_kv_cache_manager_t* manager,
                                             int64_t req_id, int64_t num_tokens,
                                             int* out) PN_NOEXCEPT;

/* Grows request req_id's table to cover its first num_tokens tokens,
 * registering the request if it is new (even when no block is needed).
 * All or nothing: PN_ERR_OUT_OF_BLOCKS (and no change) when too few blocks
 * are free. PN_ERR_INVALID_ARGUMENT: num_tokens < 0. */
pn_status_t pn_kv_cache_manager_allocate_slots(pn_kv_cache_manager_t* manager, int64_t req_id,
                                               int64_t num_tokens) PN_NOEXCEPT;

/* Returns all of request req_id's blocks to the pool and forgets the request.
 * PN_ERR_NOT_FOUND if the request has no table. */
pn_status_t pn_kv_cache_manager_free(pn_kv_cache_manager_t* manager,
                                     int64_t req_id) PN_NOEXCEPT;

/* Writes 1 to *out if request req_id has a table, else 0. */
pn_status_t pn_kv_cache_manager_has_request(const pn_kv_cache_manager_t* manager,
                                            int64_t req_id, int* out) PN_NOEXCEPT;

/* Copies request req_id's block table (block ids, in token order) into
 * out_ids[0 .. capacity) and its length (blocks) to *out_len. When capacity
 * is smaller than the table, writes only *out_len and returns
 * PN_ERR_BUFFER_TOO_SMALL: call with out_ids = NULL and capacity = 0 to learn
 * the length. PN_ERR_NOT_FOUND if the request has no table. */
pn_status_t pn_kv_cache_manager_block_table(const pn_kv_cache_manager_t* manager,
                                            int64_t req_id, int32_t* out_ids,
                                            int64_t capacity, int64_t* out_len) PN_NOEXCEPT;

/* Write the manager's sizes to *out: total blocks, tokens per block, free
 * blocks, registered requests, and the fraction of blocks in use in [0, 1]. */
pn_status_t pn_kv_cache_manager_num_blocks(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_block_size(const pn_kv_cache_manager_t* manager,
                                           int64_t* out) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_num_free_blocks(const pn_kv_cache_manager_t* manager,
                                                int64_t* out) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_num_requests(const pn_kv_cache_manager_t* manager,
                                             int64_t* out) PN_NOEXCEPT;
pn_status_t pn_kv_cache_manager_usage(const pn_kv_cache_manager_t* manager,
                                      double* out) PN_NOEXCEPT;

/* Prefix caching. For a request without a table: finds the longest cached
 * prefix of tokens[0 .. n) in whole blocks, leaving at least the last token
 * uncomputed; those blocks (shared, reference-counted) start the request's
 * new table, and *out_num_computed_tokens gets their length in tokens (a
 * multiple of block_size; 0 with caching off, and then nothing changes).
 * cache_salt[0 .. salt_len) (bytes, may be NULL when salt_len is 0) isolates
 * requests: blocks are only shared between requests with the same salt.
 * PN_ERR_ALREADY_EXISTS if the request has a table already (free it first). */
pn_status_t pn_kv_cache_manager_get_computed_blocks(pn_kv_cache_manager_t* manager,
                                                    int64_t req_id, const int64_t* tokens,
                                                    int64_t n, const char* cache_salt,
                                                    int64_t salt_len,
                                                    int64_t* out_num_computed_tokens) PN_NOEXCEPT;

/* Registers the full blocks among request req_id's first num_tokens tokens
 * (tokens[0 .. num_tokens), whose KV the host has written) in the prefix
 * cache, so later requests can share them. Incremental (blocks handled by an
 * earlier call are skipped); a no-op with caching off. PN_ERR_NOT_FOUND if
 * the request has no table; PN_ERR_INVALID_ARGUMENT if its table covers fewer
 * than num_tokens / block_size blocks. */
pn_status_t pn_kv_cache_manager_cache_blocks(pn_kv_cache_manager_t* manager, int64_t req_id,
                                             const int64_t* tokens,
                                             int64_t num_tokens) PN_NOEXCEPT;

/* Forgets every cached block (running requests keep their blocks). Writes the
 * number of blocks uncached to *out_num_uncached unless it is NULL. */
pn_status_t pn_kv_cache_manager_reset_prefix_cache(pn_kv_cache_manager_t* manager,
                                                   int64_t* out_num_uncached) PN_NOEXCEPT;

/* Writes the prefix cache counters: tokens queried by get_computed_blocks,
 * tokens found cached (both since creation), and blocks currently cached.
 * Any of the three output pointers may be NULL to skip that value. */
pn_status_t pn_kv_cache_manager_prefix_cache_stats(const pn_kv_cache_manager_t* manager,
                                                   int64_t* out_queried_tokens,
                                                   int64_t* out_hit_tokens,
                                                   int64_t* out_cached_blocks) PN_NOEXCEPT;

/* ------------------------------------------------------------ batch builder */

/* Keeps every live request's token ids (prompt + generated) and turns one
 * step's schedule into the flat arrays of a forward pass over the paged KV
 * cache. Block tables come from the manager it was created on. */
typedef struct pn_batch_builder pn_batch_builder_t;

/* The arrays of one built batch, owned by the batch handle and reused by
 * every build into it (so a step loop allocates nothing once warm). */
typedef struct pn_batch pn_batch_t;

/* Creates a builder reading block tables from `manager` into *out. The
 * builder holds a reference to the manager (see
 * pn_kv_cache_manager_destroy). */
pn_status_t pn_batch_builder_create(pn_kv_cache_manager_t* manager,
                                    pn_batch_builder_t** out) PN_NOEXCEPT;

/* Destroys the builder (NULL: no-op) and its reference to the manager. */
pn_status_t pn_batch_builder_destroy(pn_batch_builder_t* builder) PN_NOEXCEPT;

/* Registers request req_id with its prompt token_ids[0 .. n) (n >= 0).
 * PN_ERR_ALREADY_EXISTS if the id is registered. */
pn_status_t pn_batch_builder_add_request(pn_batch_builder_t* builder, int64_t req_id,
                                         const int64_t* token_ids, int64_t n) PN_NOEXCEPT;

/* Appends token_ids[i] to request req_ids[i] for i < n (one sampled token per
 * request, typically). All ids are checked first: PN_ERR_NOT_FOUND for an
 * unknown one, and then nothing is appended. */
pn_status_t pn_batch_builder_append_tokens(pn_batch_builder_t* builder, const int64_t* req_ids,
                                           const int64_t* token_ids, int64_t n) PN_NOEXCEPT;

/* Forgets request req_id and its tokens. PN_ERR_NOT_FOUND if unknown. (Its KV
 * blocks belong to the manager: free them with pn_kv_cache_manager_free.) */
pn_status_t pn_batch_builder_remove_request(pn_batch_builder_t* builder,
                                            int64_t req_id) PN_NOEXCEPT;

/* Writes 1 to *out if request req_id is registered, else 0. */
pn_status_t pn_batch_builder_has_request(const pn_batch_builder_t* builder, int64_t req_id,
                                         int* out) PN_NOEXCEPT;

/* Writes the number of tokens (prompt + appended) held for request req_id to
 * *out. PN_ERR_NOT_FOUND if unknown. */
pn_status_t pn_batch_builder_num_tokens(const pn_batch_builder_t* builder, int64_t req_id,
                                        int64_t* out) PN_NOEXCEPT;

/* Writes the number of registered requests to *out. */
pn_status_t pn_batch_builder_num_requests(const pn_batch_builder_t* builder,
                                          int64_t* out) PN_NOEXCEPT;

/* Builds into `batch` the step where, for b < n, request req_ids[b] computes
 * its tokens num_computed[b] .. num_computed[b] + num_scheduled[b] - 1
 * (B = n sequences, T = sum of num_scheduled tokens, M = the most blocks of
 * any sequence):
 *   input_ids[t], positions[t]   token id and position of flat token t   [T]
 *   slot_mapping[t]              block_table[pos / bs] * bs + pos % bs    [T]
 *   seq_lens[b]                  num_computed[b] + num_scheduled[b]       [B]
 *   query_start_loc[b]           offset of sequence b's first token     [B+1]
 *   block_tables[b * M + j]      its first ceil(seq_lens[b] / bs) blocks,
 *                                0-padded to M, row-major             [B * M]
 *   logits_indices[b]            query_start_loc[b + 1] - 1              [B]
 * Every request must be registered with the builder and have a table in the
 * manager (PN_ERR_NOT_FOUND otherwise). PN_ERR_INVALID_ARGUMENT when an id is
 * listed twice, num_computed[b] < 0, num_scheduled[b] < 1, the request holds
 * fewer than seq_lens[b] tokens or its table covers fewer than seq_lens[b]
 * slots. n = 0 builds the empty batch (B = T = M = 0, query_start_loc = {0});
 * on any error the batch is left empty like that. */
pn_status_t pn_batch_builder_build(pn_batch_builder_t* builder, const int64_t* req_ids,
                                   const int32_t* num_computed, const int32_t* num_scheduled,
                                   int64_t n, pn_batch_t* batch) PN_NOEXCEPT;

/* Creates an empty batch (as built from n = 0 requests) into *out. */
pn_status_t pn_batch_create(pn_batch_t** out) PN_NOEXCEPT;

/* Destroys the batch and its arrays (NULL: no-op). */
pn_status_t pn_batch_destroy(pn_batch_t* batch) PN_NOEXCEPT;

/* Writes the batch's sizes: sequences B, tokens T and max blocks per sequence
 * M. Any of the three output pointers may be NULL to skip that value. */
pn_status_t pn_batch_shape(const pn_batch_t* batch, int64_t* out_num_seqs,
                           int64_t* out_num_tokens, int64_t* out_max_blocks) PN_NOEXCEPT;

/* Each accessor writes a pointer to one of the batch's arrays (see
 * pn_batch_builder_build for their meaning) to *out_data and its element
 * count to *out_len. The batch keeps ownership: the pointer stays valid until
 * the next build into this batch or its destruction. *out_data may be NULL
 * when *out_len is 0. */
pn_status_t pn_batch_input_ids(const pn_batch_t* batch, const int64_t** out_data,
                               int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_positions(const pn_batch_t* batch, const int64_t** out_data,
                               int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_slot_mapping(const pn_batch_t* batch, const int64_t** out_data,
                                  int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_logits_indices(const pn_batch_t* batch, const int64_t** out_data,
                                    int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_block_tables(const pn_batch_t* batch, const int32_t** out_data,
                                  int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_seq_lens(const pn_batch_t* batch, const int32_t** out_data,
                              int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_query_start_loc(const pn_batch_t* batch, const int32_t** out_data,
                                     int64_t* out_len) PN_NOEXCEPT;

/* The batch's KV cache groups G (the manager's), and group `group`'s
 * slot_mapping [T] and block_tables [B, M] (group 0: the same arrays as
 * pn_batch_slot_mapping / pn_batch_block_tables). PN_ERR_INVALID_ARGUMENT:
 * group out of [0, G). */
pn_status_t pn_batch_num_groups(const pn_batch_t* batch, int64_t* out) PN_NOEXCEPT;
pn_status_t pn_batch_group_slot_mapping(const pn_batch_t* batch, int64_t group,
                                        const int64_t** out_data,
                                        int64_t* out_len) PN_NOEXCEPT;
pn_status_t pn_batch_group_block_tables(const pn_batch_t* batch, int64_t group,
                                        const int32_t** out_data,
                                        int64_t* out_len) PN_NOEXCEPT;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* PATERNOSTER_C_API_H_ */
