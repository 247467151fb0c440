/* A host for a hybrid model through the C API (c_api.h), without a model: the
 * KV cache groups of a Gemma 3 / Qwen3.5-like layer mix, full attention,
 * sliding-window attention (window 8) and a recurrent-state group (one state
 * slot per request, as linear-attention layers keep), over one block pool.
 *
 * Three requests of 30, 21 and 12 prompt tokens are prefilled in chunks of at
 * most 8 tokens, then decode until each has 40 tokens. Only two state slots
 * exist, so the third request waits for a slot until the first finishes.
 * Every step checks, per group, what the paged-attention and state kernels
 * would read:
 *   - full group: one live block per 4 tokens, slot_mapping = table[pos / 4] * 4 + pos % 4;
 *   - window group: the entries of blocks wholly out of the window are -1 and
 *     it never holds more than ceil((8 - 1 + chunk) / 4) + 1 blocks;
 *   - recurrent group: the request's state slot in column 0 and in every
 *     token's slot_mapping entry, the same slot for the request's whole life.
 * Exits non-zero on any inconsistency; prints one line per step. */
#include <stdio.h>

#include "paternoster/c_api.h"

enum { BLOCK_SIZE = 4, NUM_BLOCKS = 40, WINDOW = 8, CHUNK = 8, NUM_REQUESTS = 3,
       FINAL_LEN = 40, STATE_SLOTS = 2, FULL = 0, SLIDING = 1, STATE = 2 };

typedef struct {
  int64_t id, prompt_len, num_computed, num_tokens, slot;
  int done;
} request;

static int report(const char* call, pn_status_t status) {
  fprintf(stderr, "hybrid_host: %s: %s (%s)\n", call, pn_status_string(status),
          pn_last_error_message());
  return 1;
}

static int fail(const char* what, int64_t id) {
  fprintf(stderr, "hybrid_host: request %lld: %s\n", (long long)id, what);
  return 1;
}

#define TRY(call)                                        \
  do {                                                   \
    pn_status_t status_ = (call);                        \
    if (status_ != PN_OK) return report(#call, status_); \
  } while (0)

/* Checks sequence b of the batch (request r, scheduling n tokens) in every group. */
static int check(const pn_kv_cache_manager_t* kv, const pn_batch_t* batch, int64_t b,
                 int64_t t0, const request* r, int64_t n) {
  int32_t table[FINAL_LEN];
  int64_t len = 0, max_blocks = 0, i, live = 0, g;
  TRY(pn_batch_shape(batch, NULL, NULL, &max_blocks));
  for (g = 0; g < 3; ++g) {
    const int64_t* slots;
    const int32_t* rows;
    int64_t n_slots, n_rows;
    TRY(pn_batch_group_slot_mapping(batch, g, &slots, &n_slots));
    TRY(pn_batch_group_block_tables(batch, g, &rows, &n_rows));
    TRY(pn_kv_cache_manager_group_block_table(kv, r->id, g, table, FINAL_LEN, &len));
    if (g == STATE) {
      if (len != 1 || table[0] != r->slot || rows[b * max_blocks] != r->slot) {
        return fail("state slot changed or missing", r->id);
      }
      for (i = 0; i < n; ++i) {
        if (slots[t0 + i] != r->slot) return fail("token without its state slot", r->id);
      }
      continue;
    }
    for (i = 0; i < n; ++i) {
      const int64_t pos = r->num_computed + i;
      if (table[pos / BLOCK_SIZE] < 0 ||
          slots[t0 + i] != (int64_t)table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE) {
        return fail("slot_mapping disagrees with the block table", r->id);
      }
    }
    for (i = 0, live = 0; i < len; ++i) live += table[i] >= 0;
    if (g == FULL && live != (r->num_computed + n + BLOCK_SIZE - 1) / BLOCK_SIZE) {
      return fail("full-attention group lost a block", r->id);
    }
    if (g == SLIDING) {
      /* The first position the window still needs for this step's first query. */
      const int64_t first = r->num_computed - WINDOW + 1 > 0 ? r->num_computed - WINDOW + 1 : 0;
      for (i = 0; i < first / BLOCK_SIZE; ++i) {
        if (table[i] >= 0) return fail("block out of the window still held", r->id);
      }
      if (live > (WINDOW - 1 + CHUNK + BLOCK_SIZE - 1) / BLOCK_SIZE + 1) {
        return fail("window group holds more than a window and a chunk", r->id);
      }
    }
  }
  return 0;
}

int main(void) {
  const int64_t windows[3] = {0, WINDOW, 0};
  const int recurrent[3] = {0, 0, 1};
  const int64_t prompt_lens[NUM_REQUESTS] = {30, 21, 12};
  request reqs[NUM_REQUESTS];
  pn_kv_cache_manager_t* kv = NULL;
  pn_batch_builder_t* builder = NULL;
  pn_batch_t* batch = NULL;
  int64_t ids[NUM_REQUESTS], step, i, j, finished = 0, waited = 0, free_slots = 0;
  int32_t computed[NUM_REQUESTS], scheduled[NUM_REQUESTS];
  int status = 0;

  TRY(pn_kv_cache_manager_create_hybrid(NUM_BLOCKS, BLOCK_SIZE, 0, windows, recurrent, 3,
                                        STATE_SLOTS, &kv));
  TRY(pn_batch_builder_create(kv, &builder));
  TRY(pn_batch_create(&batch));
  for (i = 0; i < NUM_REQUESTS; ++i) {
    int64_t prompt[FINAL_LEN];
    reqs[i].id = 10 + i;
    reqs[i].prompt_len = reqs[i].num_tokens = prompt_lens[i];
    reqs[i].num_computed = 0;
    reqs[i].slot = -1;
    reqs[i].done = 0;
    for (j = 0; j < prompt_lens[i]; ++j) prompt[j] = 1000 * (i + 1) + j;
    TRY(pn_batch_builder_add_request(builder, reqs[i].id, prompt, prompt_lens[i]));
  }
  printf("step seqs tokens free_blocks free_state_slots\n");
  for (step = 0; finished < NUM_REQUESTS && step < 200 && status == 0; ++step) {
    int64_t n = 0, t = 0, num_tokens = 0, free_blocks = 0;
    for (i = 0; i < NUM_REQUESTS; ++i) {
      request* r = &reqs[i];
      const int64_t left = r->num_tokens - r->num_computed;
      const int64_t take = left < CHUNK ? left : CHUNK;
      pn_status_t s;
      if (r->done) continue;
      s = pn_kv_cache_manager_allocate_slots_after(kv, r->id, r->num_computed + take,
                                                   r->num_computed);
      if (s == PN_ERR_OUT_OF_BLOCKS) { /* no state slot (or block) yet: wait */
        waited += r->slot < 0;
        continue;
      }
      TRY(s);
      if (r->slot < 0) {
        int32_t slot[1];
        int64_t len = 0;
        TRY(pn_kv_cache_manager_group_block_table(kv, r->id, STATE, slot, 1, &len));
        r->slot = slot[0];
      }
      ids[n] = r->id;
      computed[n] = (int32_t)r->num_computed;
      scheduled[n] = (int32_t)take;
      ++n;
    }
    if (n == 0) return fail("no request could run", -1);
    TRY(pn_batch_builder_build(builder, ids, computed, scheduled, n, batch));
    for (i = 0, t = 0; i < n; ++i) {
      request* r = &reqs[ids[i] - 10];
      if (check(kv, batch, i, t, r, scheduled[i]) != 0) status = 1;
      t += scheduled[i];
      r->num_computed += scheduled[i];
      if (r->num_computed == r->num_tokens) { /* "sample" the next token */
        const int64_t token = 7 * r->num_tokens + r->id;
        TRY(pn_batch_builder_append_tokens(builder, &r->id, &token, 1));
        ++r->num_tokens;
      }
      if (r->num_tokens == FINAL_LEN + 1) { /* FINAL_LEN tokens computed: done */
        TRY(pn_kv_cache_manager_free(kv, r->id));
        TRY(pn_batch_builder_remove_request(builder, r->id));
        r->done = 1;
        ++finished;
      }
    }
    TRY(pn_batch_shape(batch, NULL, &num_tokens, NULL));
    TRY(pn_kv_cache_manager_num_free_blocks(kv, &free_blocks));
    TRY(pn_kv_cache_manager_num_free_state_slots(kv, &free_slots));
    printf("%4lld %4lld %6lld %11lld %16lld\n", (long long)step, (long long)n,
           (long long)num_tokens, (long long)free_blocks, (long long)free_slots);
  }
  if (status == 0 && finished != NUM_REQUESTS) status = fail("requests left unfinished", -1);
  if (status == 0 && waited == 0) status = fail("the third request never waited for a slot", -1);
  TRY(pn_kv_cache_manager_num_free_state_slots(kv, &free_slots));
  if (status == 0 && free_slots != STATE_SLOTS) status = fail("state slots leaked", -1);
  if (status == 0) {
    printf("finished %d requests; the third waited %lld steps for a state slot\n",
           NUM_REQUESTS, (long long)waited);
  }
  pn_batch_destroy(batch);
  pn_batch_builder_destroy(builder);
  pn_kv_cache_manager_destroy(kv);
  return status;
}
