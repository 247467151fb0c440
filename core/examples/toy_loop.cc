// A toy engine loop on the C++ API, without a model: requests arrive, wait,
// get admitted when KV blocks and the token budget allow (whole prompts),
// decode one token per step, are preempted (recompute) when blocks run out and
// freed when they reach max_tokens. Every step builds the batch with
// BatchBuilder, checks its arrays against the block tables, and prints one
// trace line: step, running, waiting, preempted, tokens, used and free blocks,
// and a digest of the slot mapping. c_host.c runs the same loop through the C
// API and must print the same trace. Exits non-zero on any inconsistency.
#include <cstdint>
#include <cstdio>
#include <deque>
#include <vector>

#include "paternoster/batch_builder.h"
#include "paternoster/kv_cache_manager.h"

#include "toy_config.h"

using namespace paternoster;

namespace {

struct ToyRequest {
  int64_t id = 0;
  int64_t max_tokens = 0;
  int64_t arrival = 0;
  std::vector<int64_t> tokens;  // prompt + generated, as the host knows them
  int64_t num_computed = 0;
  int64_t num_generated = 0;
};

class ToyEngine {
 public:
  ToyEngine() : kv_(PN_TOY_NUM_BLOCKS, PN_TOY_BLOCK_SIZE), builder_(kv_) {
    for (int i = 0; i < PN_TOY_NUM_REQUESTS; ++i) {
      ToyRequest r;
      r.id = pn_toy_request_id(i);
      r.max_tokens = pn_toy_max_tokens[i];
      r.arrival = pn_toy_arrival[i];
      for (int64_t j = 0; j < pn_toy_prompt_len[i]; ++j) {
        r.tokens.push_back(pn_toy_prompt_token(i, j));
      }
      requests_.push_back(r);
    }
  }

  // Runs steps until every request finished; false on any inconsistency.
  bool run() {
    std::printf("%s\n", PN_TOY_TRACE_HEADER);
    for (int64_t step = 0; finished_ < PN_TOY_NUM_REQUESTS; ++step) {
      if (step >= PN_TOY_MAX_STEPS) return fail("no progress");
      if (!run_step(step)) return false;
    }
    if (kv_.num_free_blocks() != kv_.num_blocks() || kv_.num_requests() != 0 ||
        builder_.num_requests() != 0) {
      return fail("blocks or requests left over at the end");
    }
    if (preemptions_ == 0) return fail("the toy workload is meant to preempt");
    std::printf("finished %d requests, %lld preemptions; all %lld blocks free\n",
                PN_TOY_NUM_REQUESTS, static_cast<long long>(preemptions_),
                static_cast<long long>(kv_.num_blocks()));
    return true;
  }

 private:
  static bool fail(const char* what) {
    std::fprintf(stderr, "toy_loop: %s\n", what);
    return false;
  }

  bool run_step(int64_t step) {
    for (ToyRequest& r : requests_) {
      if (r.arrival != step) continue;
      builder_.add_request(r.id, r.tokens);
      waiting_.push_back(&r);
    }
    ids_.clear();
    computed_.clear();
    scheduled_.clear();
    int64_t budget = PN_TOY_TOKEN_BUDGET;
    const int64_t preempted = schedule_running(&budget);
    if (preempted == 0) schedule_waiting(&budget);
    if (ids_.empty()) return running_.empty() && waiting_.empty() ? true : fail("stalled");

    const Batch batch = builder_.build(ids_, computed_, scheduled_);
    if (!check_batch(batch)) return false;
    sample_and_finish();
    if (!check_blocks()) return false;
    std::printf(PN_TOY_TRACE_FORMAT, static_cast<long long>(step),
                static_cast<long long>(running_.size()), static_cast<long long>(waiting_.size()),
                static_cast<long long>(preempted), static_cast<long long>(batch.shape.num_tokens),
                static_cast<long long>(kv_.num_blocks() - kv_.num_free_blocks()),
                static_cast<long long>(kv_.num_free_blocks()),
                static_cast<unsigned>(pn_toy_digest(batch.slot_mapping.data(),
                                                    batch.shape.num_tokens)));
    return true;
  }

  void schedule(ToyRequest* r, int64_t num_tokens, int64_t* budget) {
    ids_.push_back(r->id);
    computed_.push_back(static_cast<int32_t>(r->num_computed));
    scheduled_.push_back(static_cast<int32_t>(num_tokens));
    *budget -= num_tokens;
  }

  // One decode token per running request, oldest first; when blocks run out
  // the newest running request is preempted (it may be the one asking).
  int64_t schedule_running(int64_t* budget) {
    int64_t preempted = 0;
    size_t i = 0;
    while (i < running_.size()) {
      ToyRequest* r = running_[i];
      if (kv_.allocate_slots(r->id, r->num_computed + 1)) {
        schedule(r, 1, budget);
        ++i;
        continue;
      }
      ToyRequest* victim = running_.back();
      running_.pop_back();
      kv_.free(victim->id);
      victim->num_computed = 0;  // recompute prompt + generated tokens later
      waiting_.push_front(victim);
      ++preempted;
      ++preemptions_;
    }
    return preempted;
  }

  // Admits waiting requests in order while a sequence slot, the token budget
  // and KV blocks allow their whole (re)prefill.
  void schedule_waiting(int64_t* budget) {
    while (!waiting_.empty() && running_.size() < PN_TOY_MAX_NUM_SEQS) {
      ToyRequest* r = waiting_.front();
      const auto n = static_cast<int64_t>(r->tokens.size());
      if (n > *budget || !kv_.allocate_slots(r->id, n)) break;
      waiting_.pop_front();
      running_.push_back(r);
      schedule(r, n, budget);
    }
  }

  bool check_batch(const Batch& batch) const {
    const int64_t bs = kv_.block_size();
    if (batch.shape.num_seqs != static_cast<int64_t>(ids_.size())) return fail("batch size");
    for (size_t b = 0; b < ids_.size(); ++b) {
      const ToyRequest& r = *find(ids_[b]);
      const std::vector<int32_t> table = kv_.block_table(r.id);
      const int32_t start = batch.query_start_loc[b];
      if (batch.query_start_loc[b + 1] - start != scheduled_[b] ||
          batch.seq_lens[b] != computed_[b] + scheduled_[b] ||
          batch.logits_indices[b] != batch.query_start_loc[b + 1] - 1) {
        return fail("sequence arrays disagree with the schedule");
      }
      for (int32_t i = 0; i < scheduled_[b]; ++i) {
        const int64_t pos = computed_[b] + i, t = start + i;
        if (batch.positions[t] != pos || batch.input_ids[t] != r.tokens[pos] ||
            batch.slot_mapping[t] != table[pos / bs] * bs + pos % bs) {
          return fail("token arrays disagree with the block table");
        }
      }
      for (int64_t j = 0; j < (batch.seq_lens[b] + bs - 1) / bs; ++j) {
        if (batch.block_tables[b * batch.shape.max_blocks + j] != table[j]) {
          return fail("block_tables row disagrees with the block table");
        }
      }
    }
    return true;
  }

  // "Samples" one token per scheduled request; frees those at max_tokens.
  void sample_and_finish() {
    std::vector<int64_t> next(ids_.size());
    for (size_t b = 0; b < ids_.size(); ++b) {
      ToyRequest& r = *find(ids_[b]);
      r.num_computed += scheduled_[b];
      next[b] = pn_toy_sample(r.id, static_cast<int64_t>(r.tokens.size()));
      r.tokens.push_back(next[b]);
      ++r.num_generated;
    }
    builder_.append_tokens(ids_.data(), next.data(), static_cast<int64_t>(ids_.size()));
    for (size_t i = 0; i < running_.size();) {
      ToyRequest* r = running_[i];
      if (r->num_generated < r->max_tokens) {
        ++i;
        continue;
      }
      kv_.free(r->id);
      builder_.remove_request(r->id);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      ++finished_;
    }
  }

  // Used blocks are exactly those covering the running requests' KV.
  bool check_blocks() const {
    int64_t used = 0;
    for (const ToyRequest* r : running_) {
      used += (r->num_computed + kv_.block_size() - 1) / kv_.block_size();
    }
    if (kv_.num_free_blocks() != kv_.num_blocks() - used) return fail("block count mismatch");
    if (kv_.num_requests() != static_cast<int64_t>(running_.size())) {
      return fail("manager holds tables of requests that are not running");
    }
    return true;
  }

  ToyRequest* find(int64_t id) {
    for (ToyRequest& r : requests_) {
      if (r.id == id) return &r;
    }
    return nullptr;
  }
  const ToyRequest* find(int64_t id) const { return const_cast<ToyEngine*>(this)->find(id); }

  KVCacheManager kv_;
  BatchBuilder builder_;
  std::vector<ToyRequest> requests_;
  std::vector<ToyRequest*> running_;
  std::deque<ToyRequest*> waiting_;
  std::vector<int64_t> ids_;
  std::vector<int32_t> computed_, scheduled_;
  int64_t preemptions_ = 0;
  int finished_ = 0;
};

}  // namespace

int main() {
  ToyEngine engine;
  return engine.run() ? 0 : 1;
}
