/* The toy workload and trace format shared by toy_loop.cc (C++ API) and
 * c_host.c (C API), so that both hosts print the same trace. C99 and C++. */
#ifndef PATERNOSTER_EXAMPLES_TOY_CONFIG_H_
#define PATERNOSTER_EXAMPLES_TOY_CONFIG_H_

#include <stdint.h>

/* KV cache: 14 blocks of 4 tokens (56 token slots): tight enough to preempt. */
#define PN_TOY_NUM_BLOCKS 14
#define PN_TOY_BLOCK_SIZE 4
/* Scheduler: at most 4 running requests and 48 tokens per step. */
#define PN_TOY_MAX_NUM_SEQS 4
#define PN_TOY_TOKEN_BUDGET 48
/* A loop that has not finished after this many steps is stuck. */
#define PN_TOY_MAX_STEPS 1000

/* Requests: prompt length and output length (tokens), arrival step. */
#define PN_TOY_NUM_REQUESTS 8
static const int64_t pn_toy_prompt_len[PN_TOY_NUM_REQUESTS] = {9, 30, 5, 17, 12, 26, 3, 21};
static const int64_t pn_toy_max_tokens[PN_TOY_NUM_REQUESTS] = {6, 4, 12, 8, 10, 3, 15, 5};
static const int64_t pn_toy_arrival[PN_TOY_NUM_REQUESTS] = {0, 0, 1, 2, 2, 3, 5, 6};
/* Upper bound of prompt + output tokens of any request. */
#define PN_TOY_MAX_SEQ_LEN 64

static inline int64_t pn_toy_request_id(int i) { return 100 + i; }
static inline int64_t pn_toy_prompt_token(int i, int64_t j) { return (i + 1) * 1000 + j; }
/* The "sampled" token of request `id` at position `pos` (deterministic). */
static inline int64_t pn_toy_sample(int64_t id, int64_t pos) {
  return (id * 1009 + pos * 31) % 32000;
}

/* FNV-1a 32 over the low 32 bits of each of v[0 .. n). */
static inline uint32_t pn_toy_digest(const int64_t* v, int64_t n) {
  uint32_t h = 2166136261u;
  int64_t i;
  for (i = 0; i < n; ++i) {
    uint32_t x = (uint32_t)(v[i] & 0xffffffff);
    int k;
    for (k = 0; k < 4; ++k) {
      h ^= (x >> (8 * k)) & 0xffu;
      h *= 16777619u;
    }
  }
  return h;
}

#define PN_TOY_TRACE_HEADER \
  "step running waiting preempted tokens used_blocks free_blocks slot_digest"
/* step, running, waiting, preempted, tokens, used, free (long long), digest (unsigned) */
#define PN_TOY_TRACE_FORMAT "%4lld %7lld %7lld %9lld %6lld %11lld %11lld %08x\n"

#endif /* PATERNOSTER_EXAMPLES_TOY_CONFIG_H_ */
