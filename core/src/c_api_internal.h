// Internals of the C API (c_api.h): the structs behind the opaque handles and
// the guard that turns every C++ exception into a pn_status_t plus a
// thread-local message. Not installed.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "paternoster/batch_builder.h"
#include "paternoster/block_pool.h"
#include "paternoster/c_api.h"
#include "paternoster/kv_cache_manager.h"

struct pn_block_pool {
  explicit pn_block_pool(int64_t num_blocks) : pool(num_blocks) {}
  paternoster::BlockPool pool;
};

// Shared with every builder created on it, so handles die in any order.
struct pn_kv_cache_manager {
  std::shared_ptr<paternoster::KVCacheManager> kv;
};

struct pn_batch_builder {
  explicit pn_batch_builder(std::shared_ptr<paternoster::KVCacheManager> m)
      : kv(std::move(m)), builder(*kv) {}
  std::shared_ptr<paternoster::KVCacheManager> kv;  // declared first: outlives builder
  paternoster::BatchBuilder builder;
};

struct pn_batch {
  pn_batch() { clear(); }
  // The empty batch: B = T = M = 0, query_start_loc = {0}.
  void clear();
  paternoster::Batch batch;
};

namespace paternoster::c_api {

// Thrown inside a guarded body to return `status` with `message`.
struct Error {
  pn_status_t status;
  std::string message;
};

[[noreturn]] void raise(pn_status_t status, std::string message);

// Records "fn: message" as this thread's last error (truncated if long) and
// returns status; never throws.
pn_status_t set_error(pn_status_t status, const char* fn, const char* message) noexcept;
// Makes this thread's last error "".
void clear_error() noexcept;

// Runs body() (which returns void) and maps what it throws: Error to its
// status, OutOfBlocks to PN_ERR_OUT_OF_BLOCKS, std::invalid_argument and
// std::out_of_range to PN_ERR_INVALID_ARGUMENT, std::bad_alloc and
// std::length_error to PN_ERR_OUT_OF_MEMORY, anything else to PN_ERR_INTERNAL.
template <typename Body>
pn_status_t guarded(const char* fn, Body&& body) noexcept {
  try {
    body();
    clear_error();
    return PN_OK;
  } catch (const Error& e) {
    return set_error(e.status, fn, e.message.c_str());
  } catch (const OutOfBlocks& e) {
    return set_error(PN_ERR_OUT_OF_BLOCKS, fn, e.what());
  } catch (const std::invalid_argument& e) {
    return set_error(PN_ERR_INVALID_ARGUMENT, fn, e.what());
  } catch (const std::out_of_range& e) {
    return set_error(PN_ERR_INVALID_ARGUMENT, fn, e.what());
  } catch (const std::bad_alloc&) {
    return set_error(PN_ERR_OUT_OF_MEMORY, fn, "out of memory");
  } catch (const std::length_error& e) {  // a size beyond what a container can hold
    return set_error(PN_ERR_OUT_OF_MEMORY, fn, e.what());
  } catch (const std::exception& e) {
    return set_error(PN_ERR_INTERNAL, fn, e.what());
  } catch (...) {
    return set_error(PN_ERR_INTERNAL, fn, "unknown C++ exception");
  }
}

// Argument checks; each raises PN_ERR_INVALID_ARGUMENT naming `what`.
template <typename T>
T& deref(T* handle, const char* what) {
  if (handle == nullptr) raise(PN_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
  return *handle;
}
void check_out(const void* out, const char* what);
void check_array(const void* data, int64_t n, const char* what);

}  // namespace paternoster::c_api
