/* The toy engine loop of toy_loop.cc, in C through the C API (c_api.h):
 * requests arrive, wait, get admitted when KV blocks and the token budget
 * allow (whole prompts), decode one token per step, are preempted (recompute)
 * when blocks run out and freed when they reach max_tokens. Every step builds
 * the batch, checks its arrays against the block tables and prints the same
 * trace line as toy_loop. Exits non-zero on any error or inconsistency. */
#include <stdio.h>

#include "paternoster/c_api.h"

#include "toy_config.h"

typedef struct {
  int64_t id, max_tokens, arrival;
  int64_t tokens[PN_TOY_MAX_SEQ_LEN]; /* prompt + generated, as the host knows them */
  int64_t num_tokens, num_computed, num_generated;
} toy_request;

typedef struct {
  pn_kv_cache_manager_t* kv;
  pn_batch_builder_t* builder;
  pn_batch_t* batch;
  toy_request requests[PN_TOY_NUM_REQUESTS];
  int running[PN_TOY_NUM_REQUESTS], num_running; /* indices into requests, oldest first */
  int waiting[PN_TOY_NUM_REQUESTS], num_waiting; /* indices into requests, FIFO */
  /* This step's schedule. */
  int64_t ids[PN_TOY_NUM_REQUESTS];
  int32_t computed[PN_TOY_NUM_REQUESTS], scheduled[PN_TOY_NUM_REQUESTS];
  int num_scheduled;
  int64_t preemptions;
  int finished;
} toy_engine;

static int report(const char* call, pn_status_t status) {
  fprintf(stderr, "c_host: %s: %s (%s)\n", call, pn_status_string(status),
          pn_last_error_message());
  return 1;
}

static int fail(const char* what) {
  fprintf(stderr, "c_host: %s\n", what);
  return 1;
}

/* Returns 1 from the calling function when a C API call fails. */
#define TRY(call)                                   \
  do {                                              \
    pn_status_t status_ = (call);                   \
    if (status_ != PN_OK) return report(#call, status_); \
  } while (0)

static toy_request* find(toy_engine* e, int64_t id) {
  int i;
  for (i = 0; i < PN_TOY_NUM_REQUESTS; ++i) {
    if (e->requests[i].id == id) return &e->requests[i];
  }
  return NULL;
}

static void schedule(toy_engine* e, const toy_request* r, int64_t num_tokens, int64_t* budget) {
  e->ids[e->num_scheduled] = r->id;
  e->computed[e->num_scheduled] = (int32_t)r->num_computed;
  e->scheduled[e->num_scheduled] = (int32_t)num_tokens;
  ++e->num_scheduled;
  *budget -= num_tokens;
}

/* One decode token per running request, oldest first; when blocks run out the
 * newest running request is preempted (it may be the one asking). */
static int schedule_running(toy_engine* e, int64_t* budget, int64_t* preempted) {
  int i = 0, j, victim;
  *preempted = 0;
  while (i < e->num_running) {
    toy_request* r = &e->requests[e->running[i]];
    pn_status_t s = pn_kv_cache_manager_allocate_slots(e->kv, r->id, r->num_computed + 1);
    if (s == PN_OK) {
      schedule(e, r, 1, budget);
      ++i;
      continue;
    }
    if (s != PN_ERR_OUT_OF_BLOCKS) return report("pn_kv_cache_manager_allocate_slots", s);
    victim = e->running[--e->num_running];
    TRY(pn_kv_cache_manager_free(e->kv, e->requests[victim].id));
    e->requests[victim].num_computed = 0; /* recompute prompt + generated later */
    for (j = e->num_waiting; j > 0; --j) e->waiting[j] = e->waiting[j - 1];
    e->waiting[0] = victim;
    ++e->num_waiting;
    ++*preempted;
    ++e->preemptions;
  }
  return 0;
}

/* Admits waiting requests in order while a sequence slot, the token budget
 * and KV blocks allow their whole (re)prefill. */
static int schedule_waiting(toy_engine* e, int64_t* budget) {
  int j;
  while (e->num_waiting > 0 && e->num_running < PN_TOY_MAX_NUM_SEQS) {
    const int w = e->waiting[0];
    toy_request* r = &e->requests[w];
    pn_status_t s;
    if (r->num_tokens > *budget) break;
    s = pn_kv_cache_manager_allocate_slots(e->kv, r->id, r->num_tokens);
    if (s == PN_ERR_OUT_OF_BLOCKS) break;
    if (s != PN_OK) return report("pn_kv_cache_manager_allocate_slots", s);
    for (j = 1; j < e->num_waiting; ++j) e->waiting[j - 1] = e->waiting[j];
    --e->num_waiting;
    e->running[e->num_running++] = w;
    schedule(e, r, r->num_tokens, budget);
  }
  return 0;
}

static int check_batch(toy_engine* e) {
  const int64_t *input_ids, *positions, *slots, *logits;
  const int32_t *tables, *seq_lens, *qsl;
  int64_t num_seqs, max_blocks, len, table_len, i, j;
  int32_t table[PN_TOY_NUM_BLOCKS];
  int b;
  TRY(pn_batch_shape(e->batch, &num_seqs, NULL, &max_blocks));
  TRY(pn_batch_input_ids(e->batch, &input_ids, &len));
  TRY(pn_batch_positions(e->batch, &positions, &len));
  TRY(pn_batch_slot_mapping(e->batch, &slots, &len));
  TRY(pn_batch_logits_indices(e->batch, &logits, &len));
  TRY(pn_batch_block_tables(e->batch, &tables, &len));
  TRY(pn_batch_seq_lens(e->batch, &seq_lens, &len));
  TRY(pn_batch_query_start_loc(e->batch, &qsl, &len));
  if (num_seqs != e->num_scheduled) return fail("batch size");
  for (b = 0; b < e->num_scheduled; ++b) {
    const toy_request* r = find(e, e->ids[b]);
    TRY(pn_kv_cache_manager_block_table(e->kv, r->id, table, PN_TOY_NUM_BLOCKS, &table_len));
    if (qsl[b + 1] - qsl[b] != e->scheduled[b] ||
        seq_lens[b] != e->computed[b] + e->scheduled[b] || logits[b] != qsl[b + 1] - 1) {
      return fail("sequence arrays disagree with the schedule");
    }
    for (i = 0; i < e->scheduled[b]; ++i) {
      const int64_t pos = e->computed[b] + i, t = qsl[b] + i;
      const int64_t slot =
          (int64_t)table[pos / PN_TOY_BLOCK_SIZE] * PN_TOY_BLOCK_SIZE + pos % PN_TOY_BLOCK_SIZE;
      if (positions[t] != pos || input_ids[t] != r->tokens[pos] || slots[t] != slot) {
        return fail("token arrays disagree with the block table");
      }
    }
    for (j = 0; j < (seq_lens[b] + PN_TOY_BLOCK_SIZE - 1) / PN_TOY_BLOCK_SIZE; ++j) {
      if (j >= table_len || tables[b * max_blocks + j] != table[j]) {
        return fail("block_tables row disagrees with the block table");
      }
    }
  }
  return 0;
}

/* "Samples" one token per scheduled request; frees those at max_tokens. */
static int sample_and_finish(toy_engine* e) {
  int64_t next[PN_TOY_NUM_REQUESTS];
  int b, i, kept = 0;
  for (b = 0; b < e->num_scheduled; ++b) {
    toy_request* r = find(e, e->ids[b]);
    r->num_computed += e->scheduled[b];
    next[b] = pn_toy_sample(r->id, r->num_tokens);
    if (r->num_tokens >= PN_TOY_MAX_SEQ_LEN) return fail("PN_TOY_MAX_SEQ_LEN too small");
    r->tokens[r->num_tokens++] = next[b];
    ++r->num_generated;
  }
  TRY(pn_batch_builder_append_tokens(e->builder, e->ids, next, e->num_scheduled));
  for (i = 0; i < e->num_running; ++i) {
    const toy_request* r = &e->requests[e->running[i]];
    if (r->num_generated < r->max_tokens) {
      e->running[kept++] = e->running[i];
      continue;
    }
    TRY(pn_kv_cache_manager_free(e->kv, r->id));
    TRY(pn_batch_builder_remove_request(e->builder, r->id));
    ++e->finished;
  }
  e->num_running = kept;
  return 0;
}

/* Used blocks are exactly those covering the running requests' KV. */
static int check_blocks(toy_engine* e) {
  int64_t used = 0, num_free, num_requests;
  int i;
  for (i = 0; i < e->num_running; ++i) {
    used += (e->requests[e->running[i]].num_computed + PN_TOY_BLOCK_SIZE - 1) / PN_TOY_BLOCK_SIZE;
  }
  TRY(pn_kv_cache_manager_num_free_blocks(e->kv, &num_free));
  TRY(pn_kv_cache_manager_num_requests(e->kv, &num_requests));
  if (num_free != PN_TOY_NUM_BLOCKS - used) return fail("block count mismatch");
  if (num_requests != e->num_running) {
    return fail("manager holds tables of requests that are not running");
  }
  return 0;
}

static int run_step(toy_engine* e, int64_t step) {
  int64_t budget = PN_TOY_TOKEN_BUDGET, preempted, num_tokens, num_free;
  const int64_t* slots;
  int64_t num_slots;
  int i;
  for (i = 0; i < PN_TOY_NUM_REQUESTS; ++i) {
    toy_request* r = &e->requests[i];
    if (r->arrival != step) continue;
    TRY(pn_batch_builder_add_request(e->builder, r->id, r->tokens, r->num_tokens));
    e->waiting[e->num_waiting++] = i;
  }
  e->num_scheduled = 0;
  if (schedule_running(e, &budget, &preempted) != 0) return 1;
  if (preempted == 0 && schedule_waiting(e, &budget) != 0) return 1;
  if (e->num_scheduled == 0) {
    return e->num_running == 0 && e->num_waiting == 0 ? 0 : fail("stalled");
  }
  TRY(pn_batch_builder_build(e->builder, e->ids, e->computed, e->scheduled, e->num_scheduled,
                             e->batch));
  if (check_batch(e) != 0 || sample_and_finish(e) != 0 || check_blocks(e) != 0) return 1;
  TRY(pn_batch_shape(e->batch, NULL, &num_tokens, NULL));
  TRY(pn_batch_slot_mapping(e->batch, &slots, &num_slots));
  TRY(pn_kv_cache_manager_num_free_blocks(e->kv, &num_free));
  printf(PN_TOY_TRACE_FORMAT, (long long)step, (long long)e->num_running,
         (long long)e->num_waiting, (long long)preempted, (long long)num_tokens,
         (long long)(PN_TOY_NUM_BLOCKS - num_free), (long long)num_free,
         (unsigned)pn_toy_digest(slots, num_slots));
  return 0;
}

static int run(toy_engine* e) {
  int64_t step, num_free, kv_requests, builder_requests;
  int i;
  int64_t j;
  for (i = 0; i < PN_TOY_NUM_REQUESTS; ++i) {
    toy_request* r = &e->requests[i];
    r->id = pn_toy_request_id(i);
    r->max_tokens = pn_toy_max_tokens[i];
    r->arrival = pn_toy_arrival[i];
    r->num_tokens = pn_toy_prompt_len[i];
    for (j = 0; j < r->num_tokens; ++j) r->tokens[j] = pn_toy_prompt_token(i, j);
  }
  printf("%s\n", PN_TOY_TRACE_HEADER);
  for (step = 0; e->finished < PN_TOY_NUM_REQUESTS; ++step) {
    if (step >= PN_TOY_MAX_STEPS) return fail("no progress");
    if (run_step(e, step) != 0) return 1;
  }
  TRY(pn_kv_cache_manager_num_free_blocks(e->kv, &num_free));
  TRY(pn_kv_cache_manager_num_requests(e->kv, &kv_requests));
  TRY(pn_batch_builder_num_requests(e->builder, &builder_requests));
  if (num_free != PN_TOY_NUM_BLOCKS || kv_requests != 0 || builder_requests != 0) {
    return fail("blocks or requests left over at the end");
  }
  if (e->preemptions == 0) return fail("the toy workload is meant to preempt");
  printf("finished %d requests, %lld preemptions; all %lld blocks free\n", PN_TOY_NUM_REQUESTS,
         (long long)e->preemptions, (long long)num_free);
  return 0;
}

int main(void) {
  static toy_engine engine; /* zero-initialized */
  int rc = 1;
  if (pn_version() != PN_VERSION) return fail("library and header versions differ");
  if (pn_kv_cache_manager_create(PN_TOY_NUM_BLOCKS, PN_TOY_BLOCK_SIZE, 0, &engine.kv) != PN_OK ||
      pn_batch_builder_create(engine.kv, &engine.builder) != PN_OK ||
      pn_batch_create(&engine.batch) != PN_OK) {
    fprintf(stderr, "c_host: setup failed: %s\n", pn_last_error_message());
  } else {
    rc = run(&engine);
  }
  /* Any order: the builder keeps the manager alive. */
  pn_kv_cache_manager_destroy(engine.kv);
  pn_batch_builder_destroy(engine.builder);
  pn_batch_destroy(engine.batch);
  return rc;
}
